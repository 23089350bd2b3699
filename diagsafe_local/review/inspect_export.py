"""A run as an Inspect AI eval log, built with `inspect_ai`'s own log classes, so `inspect view` opens it.

One sample per judged answer: its conversation up to the judged turn as the input, the answer as the output,
the judge's score as the score (its rationale as the explanation, the verdict fields and the parse status as
score metadata), category, source, attack method, target and item as sample metadata; the summary's rates
(ASR with its interval, harmful share, refusal and over-refusal rates, failure rate) as the eval's metrics.
`inspect_ai` is an optional extra (`pip install 'diagsafe-local[inspect]'`), imported only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagsafe_local import __version__
from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.runs.passes import decided, decided_results
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.verdicts import rationale
from diagsafe_local.runs.verify import VerifiedRun


def _messages(record: ResultRecord) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageUser

    kinds = {"system": ChatMessageSystem, "user": ChatMessageUser, "assistant": ChatMessageAssistant}
    return [kinds[m.role](content=m.content) for m in record.conversation]


def _sample(record: ResultRecord) -> Any:
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelOutput
    from inspect_ai.scorer import Score

    verdict = record.verdict or {}
    score = Score(
        value=record.score if record.score is not None else "unscored",
        answer=record.answer,
        explanation=rationale(verdict) or record.error,
        metadata={
            "judge": record.judge_rubric,
            "parse_status": record.parse_status,
            "verdict": verdict,
            "reasoning": record.reasoning.text if record.reasoning else None,
        },
    )
    return EvalSample(
        id=f"{record.target}/{record.item_id}/{record.sample}/{record.turn}",
        epoch=record.sample + 1,
        input=_messages(record),
        target="",
        output=ModelOutput.from_content(model=record.target_engine.model, content=record.answer),
        scores={"judge": score},
        metadata={
            "target": record.target,
            "item_id": record.item_id,
            "sample": record.sample,
            "turn": record.turn,
            "category": record.category,
            "source": record.source,
            "attack_method": record.attack_method,
            "benign": record.benign,
            "final_turn": record.final_turn,
            "finish_reason": record.finish_reason,
        },
    )


def inspect_log(run: VerifiedRun, targets: list[str] | None = None) -> Any:
    """The EvalLog of a verified run (of `targets`, default all)."""
    try:
        from inspect_ai.log import (
            EvalConfig,
            EvalDataset,
            EvalLog,
            EvalMetric,
            EvalResults,
            EvalScore,
            EvalSpec,
            EvalStats,
        )
    except ImportError:
        raise MissingDependencyError("inspect-ai", "inspect", "diagsafe-local export --format inspect") from None
    names = targets or list(run.summary.targets)
    unknown = [n for n in names if n not in run.summary.targets]
    if unknown:
        raise DiagsafeError(f"unknown target(s) {unknown}; this run has {list(run.summary.targets)}")
    # Inspect's writer takes the whole log: its samples are held, built as the verified results stream past, each
    # scored as the gate decides on it (a cascade's verdict), as are the metrics
    samples = [_sample(line.record) for line in decided_results(run) if line.record.target in names]
    manifest, summary = run.manifest, decided(run)
    metrics: dict[str, Any] = {}
    for name in names:
        stats = summary.targets[name]
        prefix = f"{name}/" if len(names) > 1 else ""
        figures = {
            "asr": stats.asr.value,
            "asr_ci_low": stats.asr.ci_low,
            "asr_ci_high": stats.asr.ci_high,
            "harmful_rate": stats.harmful_rate.rate,
            "refusal_rate": stats.refusal_rate.rate,
            "over_refusal_rate": stats.over_refusal_rate.rate,
            "failure_rate": stats.failure_rate,
        }
        metrics |= {
            f"{prefix}{key}": EvalMetric(name=f"{prefix}{key}", value=value)
            for key, value in figures.items()
            if value is not None
        }
    created = manifest.started or manifest.updated or ""
    spec = EvalSpec(
        run_id=manifest.run_id,
        created=created,
        task="diagsafe-local",
        task_version=__version__,
        dataset=EvalDataset(name=manifest.dataset.spec, location=manifest.dataset.path, samples=len(samples)),
        model=names[0] if len(names) == 1 else "+".join(names),
        config=EvalConfig(),
        packages={"diagsafe-local": __version__},
        metadata={
            "judge": manifest.judge.model_dump(mode="json") if manifest.judge else None,
            "run_dir": str(run.run_dir),
        },
    )
    scored = sum(s.scores is not None and s.scores["judge"].value != "unscored" for s in samples)
    results = EvalResults(
        total_samples=len(samples),
        completed_samples=len(samples),
        scores=[
            EvalScore(
                name="judge",
                scorer=manifest.judge.rubric if manifest.judge else "judge",
                scored_samples=scored,
                unscored_samples=len(samples) - scored,
                metrics=metrics,
            )
        ],
    )
    timing = EvalStats(started_at=created, completed_at=manifest.updated or created)
    return EvalLog(status="success", eval=spec, results=results, stats=timing, samples=samples)


def _ours(path: Path) -> bool:
    """Whether a file is an Inspect log this tool wrote."""
    from inspect_ai.log import read_eval_log

    try:
        return bool(read_eval_log(str(path), header_only=True).eval.task == "diagsafe-local")
    except Exception:  # anything that does not read as an Inspect log is not ours
        return False


def export_inspect(run: VerifiedRun, out: Path, targets: list[str] | None = None) -> Path:
    """Write the run's Inspect AI log to `out` (`.eval` or `.json`): never inside the run directory, and never over
    a file this tool did not write (an existing file must read as an Inspect log of ours)."""
    from inspect_ai.log import write_eval_log

    if out.suffix not in (".eval", ".json"):
        raise DiagsafeError(f"{out}: an Inspect log ends in .eval or .json")
    if out.resolve().is_relative_to(run.run_dir.resolve()):
        raise DiagsafeError(f"{out}: inside the run directory {run.run_dir}; write the log elsewhere")
    if out.exists() and not _ours(out):
        raise DiagsafeError(
            f"{out} exists and is not an Inspect log written by diagsafe-local: it is never overwritten"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(inspect_log(run, targets), str(out))
    return out
