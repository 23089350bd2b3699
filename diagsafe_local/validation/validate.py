"""The `validate` command's work: score judges, metrics and stored verdict columns against a gold set's human
labels, optionally combine judges into a panel, and write the agreement tables and figures.

What is validated, each as one row of agreement.csv:
- a live judge: the same judge spec (`JudgeConfig`) as `run` and `bench`: any registered judge or policy file on
  the same engines (vLLM, API, classifier; `refusal-keywords` and metric judges need none), its verdicts stored
  in `judgments.jsonl` (resumable);
- a metric: a registered reference metric or keyword matcher, cut at its best threshold (harm sets only:
  every metric measures harm);
- a stored column: verdicts already in the file (JailbreakBench's four judges);
- a panel (`judging.panel`): `majority`, `any` or `all` of the judges' and stored columns' decisions, or the
  `mean` of their scores (a member without a verdict abstains; a majority tie is no verdict).
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diagsafe_local import __version__
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.judging.cards import judge_identity, jury_identity, store_validation
from diagsafe_local.judging.config import JudgeConfig, JuryConfig
from diagsafe_local.judging.panel import PANEL_RULES
from diagsafe_local.runs.verdicts import combined_score, panel_score
from diagsafe_local.validation.gold import XSTEST_CLASSES, GoldSet
from diagsafe_local.validation.outputs import Scored, write_outputs

logger = logging.getLogger(__name__)

_CLASS_OF_LABEL = {
    "full_compliance": XSTEST_CLASSES[0],
    "full_refusal": XSTEST_CLASSES[1],
    "partial_refusal": XSTEST_CLASSES[2],
}


def check_request(
    gold: GoldSet,
    judges: Sequence[JudgeConfig],
    metrics: Sequence[str],
    stored: Sequence[str],
    panel: str | None,
    classes: int,
) -> None:
    """Refuse what cannot be validated on this set before any model loads or file is written."""
    from diagsafe_local.metrics import METRICS

    if not judges and not metrics and not stored and not gold.stored_columns:
        raise DiagsafeError("nothing to validate: give --judge, --metric or --stored")
    for spec in judges:
        judge = spec.harm_judge
        if judge.measures != gold.task:
            raise DiagsafeError(
                f"judge '{judge.name}' measures {judge.measures}, but this {gold.format} set's labels are {gold.task}"
                + (
                    " (use a refusal judge: refusal, refusal-keywords, wildguard-refusal, ...)"
                    if gold.task == "refusal"
                    else ""
                )
            )
        if judge.needs_reference and not all(item.references for item in gold.items):
            raise DiagsafeError(f"judge '{judge.name}' needs reference answers, which this {gold.format} set lacks")
    for name in metrics:
        spec_m = METRICS.get(name)
        if gold.task != "harm":
            raise DiagsafeError(f"metric '{name}' measures harm; this {gold.format} set's labels are {gold.task}")
        if spec_m.needs_reference and not all(item.references for item in gold.items):
            raise DiagsafeError(f"metric '{name}' needs reference answers, which this {gold.format} set lacks")
    missing = [c for c in stored if c not in gold.stored_columns]
    if missing:
        raise DiagsafeError(
            f"--stored column(s) {', '.join(missing)} not read; the set has {', '.join(gold.stored_columns) or 'none'}"
        )
    if panel is not None and panel not in PANEL_RULES:
        raise DiagsafeError(f"--panel must be one of {', '.join(PANEL_RULES)}; got '{panel}'")
    if panel is not None and len(judges) + len(stored or gold.stored_columns) < 2:
        raise DiagsafeError("--panel needs at least two judges or stored columns")
    if classes not in (2, 3):
        raise DiagsafeError(f"--classes must be 2 or 3; got {classes}")
    if classes == 3 and not any(item.label3 for item in gold.items):
        raise DiagsafeError("--classes 3 needs XSTest's three classes in the gold labels")


def _judge_scores(
    gold: GoldSet,
    spec: JudgeConfig,
    samples: int,
    out: Path,
    seed: int,
    verbose: bool,
    engine_factory: Any,
    label: str | None = None,
) -> Scored:
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.core.messages import Message
    from diagsafe_local.engines import create_engine
    from diagsafe_local.engines.identity import engine_identity, hub_snapshot_hash
    from diagsafe_local.judging import JudgeInput
    from diagsafe_local.judging.stored import judge_items

    name = spec.rubric_name
    live = spec.needs_model
    label = label or (f"{name}@{Path(spec.model.rstrip('/')).name}" if live and spec.model else name)
    inputs = [
        (
            item.id,
            JudgeInput(
                conversation=(Message(role="user", content=item.prompt),),
                answer=item.response,
                references=item.references,
            ),
        )
        for item in gold.items
    ]
    with engine_output(None if verbose or not live else out / "run.log") as console:
        engine = (engine_factory or create_engine)(spec, structured_backend="xgrammar") if live else None
        try:
            verdicts = judge_items(
                engine,
                name,
                label,
                inputs,
                out / "judgments.jsonl",
                samples,
                spec.decoding(),
                max_attempts=spec.max_attempts,
                seed=seed,
                on_batch=lambda done, total: console.progress(f"{label}: judging", done, total),
            )
        finally:
            if engine is not None:
                engine.close()
    failed = sum(v.status == "error" for stored in verdicts.values() for v in stored)
    if failed:
        logger.warning(
            "%s: the engine failed on %d of %d judgments; they count as missing: run validate again to ask again",
            label, failed, sum(map(len, verdicts.values())),
        )  # fmt: skip
    scores, classes, raw, reasoning = [], [], [], []
    for item in gold.items:
        judged = [v for v in verdicts[item.id] if v.score is not None]
        scores.append(float(np.mean([v.score for v in judged])) if judged else np.nan)
        labels = [(v.verdict or {}).get("label") for v in judged]
        classes.append(_CLASS_OF_LABEL.get(labels[0]) if len(labels) == 1 and isinstance(labels[0], str) else None)
        raw.append(verdicts[item.id][-1].raw)
        thought = verdicts[item.id][-1].reasoning
        reasoning.append(thought.text if thought else None)
    identity = {"rubric": name, "model": None, "model_hash": None, "lora_hash": None, "scoring": spec.scoring}
    if live:
        identity |= engine_identity(spec).model_dump(include={"model", "model_hash", "lora_hash"})
        identity["snapshot_hash"] = hub_snapshot_hash(spec)  # after the run: the snapshot the engine loaded
    return Scored(label, "judge", np.array(scores), classes, raw, identity, reasoning)


def _metric_scores(gold: GoldSet, names: Sequence[str]) -> list[Scored]:
    from diagsafe_local.benchmark.runner import aggregate_references
    from diagsafe_local.metrics import METRICS, TextPair, compute_metrics

    items = gold.items
    with_ref = [n for n in names if METRICS.get(n).needs_reference]
    without = [n for n in names if not METRICS.get(n).needs_reference]
    expanded = [TextPair(i.prompt, i.response, ref) for i in items for ref in i.references]
    owner = np.repeat(np.arange(len(items)), [len(i.references) for i in items])
    computed = {
        name: aggregate_references(raw, owner, np.zeros(len(items), dtype=bool), len(items))
        for name, raw in compute_metrics(with_ref, expanded).items()
    }
    computed |= compute_metrics(without, [TextPair(i.prompt, i.response) for i in items])
    return [Scored(f"metric:{n}", "metric", computed[n]) for n in names]


def _stored_scores(gold: GoldSet, names: Sequence[str]) -> list[Scored]:
    unknown = {"rubric": None, "model": None, "model_hash": None, "lora_hash": None}
    return [
        Scored(
            f"stored:{n}",
            "stored",
            np.array([np.nan if (v := i.stored.get(n)) is None else v for i in gold.items], dtype=float),
            identity={**unknown, **gold.stored_identities.get(n, {}), "column": n},
        )
        for n in names
    ]


def panel_scores(members: Sequence[Scored], rule: str) -> Scored:
    """The panel's per-item score (see `judging.panel`)."""
    columns = zip(*(m.scores.tolist() for m in members))
    value = [panel_score(list(scores), rule) for scores in columns]
    return Scored(f"panel:{rule}", "panel", np.array([np.nan if v is None else v for v in value], dtype=float))


def jury_scores(
    gold: GoldSet, jury: JuryConfig, samples: int, out: Path, seed: int, verbose: bool, engine_factory: Any
) -> list[Scored]:
    """Each member of a jury as a judge of its own (one model loaded at a time), and the jury as one judge: its
    members' decisions combined by its rule, ties failing closed as in a run."""
    members = [_judge_scores(gold, m, samples, out, seed, verbose, engine_factory, m.label) for m in jury.members]
    columns = zip(*(m.scores.tolist() for m in members), strict=True)
    label = jury.label()
    value = [combined_score(label, list(scores)) for scores in columns]
    identity = {"rubric": label, **jury.identity(), "scoring": "sampled"}
    scores = np.array([np.nan if v is None else v for v in value], dtype=float)
    return [*members, Scored(label, "judge", scores, identity=identity)]


def _validated(
    rows: Sequence[Scored], judges: Sequence[JudgeConfig], jury: JuryConfig | None
) -> list[tuple[str, str, str]]:
    """Each validated judge (and a jury's members and the jury) as its judge card keys it: its label in
    validation.json, its registered name and its identity."""
    validated = [(row.name, spec.rubric_name, judge_identity(spec)) for row, spec in zip(rows, judges)]
    for member in jury.members if jury else []:
        validated.append((member.label, member.rubric_name, judge_identity(member)))
    if jury is not None:
        validated.append((jury.label(), jury.label(), jury_identity(jury)))
    return validated


def run_validate(
    gold: GoldSet,
    out: Path,
    judges: Sequence[JudgeConfig] = (),
    metrics: Sequence[str] = (),
    stored: Sequence[str] = (),
    panel: str | None = None,
    classes: int = 2,
    bootstrap: int = 1000,
    seed: int = 0,
    verbose: bool = False,
    engine_factory: Any = None,
    target_fpr: float | None = None,
    samples: int = 1,
    jury: JuryConfig | None = None,
) -> list[dict[str, Any]]:
    """Validate, lock `out`, judge, and write every output as one set; returns the agreement rows.
    `engine_factory(config, **options)` makes the judges' engines (default: `engines.create_engine`)."""
    from diagsafe_local.core.atomic import remove_stale_temporaries
    from diagsafe_local.core.locking import DirectoryLock

    stored = list(stored) if stored else list(gold.stored_columns)
    check_request(gold, [*judges, *(jury.members if jury else [])], metrics, stored, panel, classes)
    lock = DirectoryLock(out, "validate")  # also proves --out writable before any judging
    remove_stale_temporaries(out)
    try:
        rows: list[Scored] = [_judge_scores(gold, spec, samples, out, seed, verbose, engine_factory) for spec in judges]
        if jury is not None:
            rows += jury_scores(gold, jury, samples, out, seed, verbose, engine_factory)
        rows += _stored_scores(gold, stored)
        if panel:
            rows.append(panel_scores(rows, panel))
        rows += _metric_scores(gold, metrics)
        manifest = {
            "tool": f"diagsafe-local {__version__}",
            "python": platform.python_version(),
            "gold": gold.source,
            "gold_path": gold.path,
            "gold_sha256": gold.sha256,
            "format": gold.format,
            "task": gold.task,
            "n_items": len(gold.items),
            "n_labelled": len(gold.labelled),
            "n_unlabelled": len(gold.items) - len(gold.labelled),
            "judges": [spec.model_dump(mode="json", exclude_none=True) for spec in judges],
            "jury": jury.model_dump(mode="json", exclude_none=True) if jury else None,
            "samples": samples,
            "metrics": list(metrics),
            "stored": stored,
            "panel": panel,
            "classes": classes,
            "bootstrap": bootstrap,
            "seed": seed,
            "target_fpr": target_fpr,
        }
        agreement = write_outputs(out, gold, rows, manifest, classes, bootstrap, seed, target_fpr)
        store_validation(out, _validated(rows, judges, jury))
        return agreement
    finally:
        lock.release()
