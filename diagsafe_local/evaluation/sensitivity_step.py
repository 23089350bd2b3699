"""Judge sensitivity, the step: a target's sample (`runs.sensitivity`) judged again by its judge under each
paraphrase of the judge's prompt, on the judge's engine once the target's own verdicts are in; each verdict is
stored as it comes in (sensitivity.jsonl), and a resumed run judges only what is missing."""

from __future__ import annotations

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.rubrics import Rubric
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.manifest import ItemRef
from diagsafe_local.runs.records import SensitivityRecord
from diagsafe_local.runs.sensitivity import sensitivity_sample


def pending_sensitivity(ctx: RunContext, target: str, samples: int, items: list[ItemRef]) -> list[tuple]:
    """(item, sample, turn, variant number) of the target's sample not yet judged under a paraphrase."""
    settings = ctx.config.judge.sensitivity
    if settings is None:
        return []
    name = ctx.config.judge.rubric_name
    return [
        (*key, k)
        for key in sensitivity_sample(items, samples, settings.sample)
        for k in range(1, settings.variants + 1)
        if ctx.directory.sensitivity.get((target, *key, f"{name}~{k}")) is None
    ]


def judge_sensitivity(engine: Engine, ctx: RunContext, target: str, pending: list[tuple]) -> None:
    """Judge the pending (item, sample, turn, variant) of a target; every verdict stored as it is final."""
    judge = ctx.config.judge
    harm = JUDGES.get(judge.rubric_name)
    assert isinstance(harm, Rubric)  # the config allows sensitivity only for a judge with paraphrases
    items = ctx.items_by_id
    stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, judge.batch_size)
    try:
        for item_id, sample, turn, k in pending:
            result = ctx.directory.results.get((target, item_id, sample, turn))
            if result is None:  # the target's own verdict is missing: verify says so
                continue
            judged = JudgeInput(
                conversation=tuple(result.conversation), answer=result.answer, references=items[item_id].references
            )
            variant = harm.variant(k)
            seed_key = (target, item_id, sample, turn, variant.name)
            stream.submit((item_id, sample, turn, variant.name, result.category), variant, judged, seed_key)
        while stream.pending:
            ctx.directory.sensitivity.append(
                SensitivityRecord(
                    run_id=ctx.run_id,
                    target=target,
                    item_id=item_id,
                    sample=sample,
                    turn=turn,
                    category=category,
                    variant=name,
                    score=verdict.outcome.score,
                    parse_status=verdict.outcome.status,
                    judge_raw=verdict.completion.text if verdict.completion else verdict.outcome.error,
                )
                for (item_id, sample, turn, name, category), verdict in stream.poll()
            )
    finally:
        stream.close()
