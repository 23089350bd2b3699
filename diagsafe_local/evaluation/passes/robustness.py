"""Answer perturbations, a pass (`runs.robustness`): each target's sample judged again by the harm judge after
each meaning-preserving edit of the answer (and with `over_refusal`, its sample of benign answers by the
over-refusal judge after each edit declared for them), on the judge's engine once that target's own verdicts are in. Every
verdict is stored as it is final (robustness.jsonl); a resumed run judges only what is missing or erred."""

from __future__ import annotations

from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.engines.base import Engine
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.passes.base import JudgingPass, Runner
from diagsafe_local.judging.base import JUDGES, JudgeInput
from diagsafe_local.judging.verdicts import VerdictStream
from diagsafe_local.runs.records import ResultRecord, RobustnessRecord
from diagsafe_local.runs.robustness import BY_NAME, Perturbation
from diagsafe_local.runs.sensitivity import sensitivity_sample

Pending = tuple[ResultRecord, Perturbation, str]  # the answer's record, the edit, the edited answer (benign or not)


class RobustnessPass(JudgingPass):
    """The perturbed verdicts not yet judged (or errored), target by target."""

    name = "answer robustness"

    @classmethod
    def cost(cls, config: RunConfig) -> str | None:
        settings = config.judge.robustness
        if settings is None:
            return None
        extra = len(settings.perturbations) * settings.sample
        benign = sum(p.benign is not None for p in map(BY_NAME.__getitem__, settings.perturbations))
        return (
            f"answer robustness: {len(settings.perturbations)} perturbations x {settings.sample} answers of harmful "
            f"items (each edit only where it applies) = up to {extra} more verdicts per target "
            f"({extra * len(config.targets)} in all)"
            + (f", and {benign} x {settings.sample} answers of benign items where the dataset has them" if
               settings.over_refusal and benign else "")
            + ", one process"
        )  # fmt: skip

    def _store(self, run: Runner) -> JsonlStore[RobustnessRecord]:
        return run.ctx.directory.store(RobustnessRecord)

    def _pending(self, run: Runner, target: TargetConfig) -> list[Pending]:
        settings = run.config.judge.robustness
        if settings is None:
            return []
        store, results = self._store(run), run.ctx.directory.results
        chosen = [BY_NAME[name] for name in settings.perturbations]
        pending: list[Pending] = []
        arms = (False, True) if settings.over_refusal else (False,)
        keys = [
            k
            for benign in arms
            for k in sensitivity_sample(run.dataset.items or [], target.sampling.n, settings.sample, benign)
        ]
        for key in keys:
            result = results.get((target.label, *key))
            if result is None:  # the target's own verdict is missing: verify says so
                continue
            for p in chosen:
                edited = p.perturbed(result.answer, result.score, result.benign)
                stored = store.get((target.label, *key, p.name))
                if edited is not None and (stored is None or stored.parse_status == "error"):
                    pending.append((result, p, edited))
        return pending

    def needs_judge(self, run: Runner) -> bool:
        return any(self._pending(run, target) for target in run.config.targets)

    def target_judged(self, run: Runner, engine: Engine | None, target: TargetConfig) -> None:
        pending = self._pending(run, target) if engine is not None else []
        if not pending:
            return
        judge, store = run.config.judge, self._store(run)
        rubrics, items = (
            {False: JUDGES.get(judge.rubric_name), True: JUDGES.get(judge.benign_rubric)},
            run.ctx.items_by_id,
        )
        stream = VerdictStream(engine, judge.decoding(), judge.sampling.seed, judge.max_attempts, judge.batch_size)
        by_key = {(*result.key, p.name): result for result, p, _ in pending}
        try:
            for result, p, edited in pending:
                shown = JudgeInput(
                    conversation=tuple(result.conversation), answer=edited, references=items[result.item_id].references
                )
                stream.submit((*result.key, p.name), rubrics[result.benign], shown, (*result.key, "robustness", p.name))
            while stream.pending:
                store.append(
                    RobustnessRecord(
                        run_id=run.ctx.run_id,
                        target=target.label,
                        item_id=item_id,
                        sample=sample,
                        turn=turn,
                        category=by_key[target.label, item_id, sample, turn, name].category,
                        perturbation=name,
                        score=verdict.outcome.score,
                        parse_status=verdict.outcome.status,
                        judge_raw=verdict.reply,
                    )
                    for (_, item_id, sample, turn, name), verdict in stream.poll()
                )
        finally:
            stream.close()
