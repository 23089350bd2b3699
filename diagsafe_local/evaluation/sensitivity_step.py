"""Judge sensitivity, the step: a target's sample (`runs.sensitivity`) judged again by its judge under each
paraphrase of the judge's prompt (and its benign sample by the over-refusal judge under each of its own), on
the judge's engine once the target's own verdicts are in; each verdict is stored as it comes in
(sensitivity.jsonl), and a resumed run judges only what is missing or erred (the last record of a key wins).
A verdict that never came is not left out: the gate's check is INCONCLUSIVE while one is unjudged."""

from __future__ import annotations

from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.config import judge_name
from diagsafe_local.judging.rubrics import Rubric
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.manifest import ItemRef
from diagsafe_local.runs.records import SensitivityRecord
from diagsafe_local.runs.sensitivity import sensitivity_sample


def _arms(ctx: RunContext) -> list[tuple[Rubric, bool]]:
    """The judges whose paraphrases the run's sample is judged under: the harm judge on harmful items' answers,
    and (`over_refusal`) the over-refusal judge on benign items' answers."""
    judge, settings = ctx.config.judge, ctx.config.judge.sensitivity
    arms = [(JUDGES.get(judge.rubric_name), False)]
    if settings is not None and settings.over_refusal:
        arms.append((JUDGES.get(judge_name(judge.benign_rubric)), True))
    checked = [(j, benign) for j, benign in arms if isinstance(j, Rubric)]
    assert len(checked) == len(arms)  # the config allows sensitivity only for judges with paraphrases
    return checked


def pending_sensitivity(ctx: RunContext, target: str, samples: int, items: list[ItemRef]) -> list[tuple]:
    """(item, sample, turn, variant number, benign) of the target's sample not yet judged under a paraphrase, or
    whose verdict was an error (asked again, as the judge's own errors are)."""
    settings = ctx.config.judge.sensitivity
    if settings is None:
        return []

    def judged(key: tuple) -> bool:
        stored = ctx.directory.store(SensitivityRecord).get(key)
        return stored is not None and stored.parse_status != "error"

    return [
        (*key, k, benign)
        for judge, benign in _arms(ctx)
        for key in sensitivity_sample(items, samples, settings.sample, benign)
        for k in range(1, settings.variants + 1)
        if not judged((target, *key, f"{judge.name}~{k}"))
    ]


def judge_sensitivity(engine: Engine, ctx: RunContext, target: str, pending: list[tuple]) -> None:
    """Judge the pending (item, sample, turn, variant, benign) of a target; every verdict stored as it is final."""
    judge = ctx.config.judge
    judges = {benign: rubric for rubric, benign in _arms(ctx)}
    items = ctx.items_by_id
    stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, judge.batch_size)
    try:
        for item_id, sample, turn, k, benign in pending:
            result = ctx.directory.results.get((target, item_id, sample, turn))
            if result is None:  # the target's own verdict is missing: verify says so
                continue
            judged = JudgeInput(
                conversation=tuple(result.conversation), answer=result.answer, references=items[item_id].references
            )
            variant = judges[benign].variant(k)
            seed_key = (target, item_id, sample, turn, variant.name)
            stream.submit((item_id, sample, turn, variant.name, result.category), variant, judged, seed_key)
        while stream.pending:
            ctx.directory.store(SensitivityRecord).append(
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
                    judge_raw=verdict.reply,
                )
                for (item_id, sample, turn, name, category), verdict in stream.poll()
            )
    finally:
        stream.close()
