"""A whole evaluation run: items -> target answers (turn by turn) -> judge verdicts -> run directory.

This module orchestrates; each job it hands out has a module of its own: the run directory (`run_directory`:
lock, resume or overwrite, stores), where the engines go (`engines.host`: sequential, colocate, sleep; the GPU
plan in `planning`), the answers (`generation`), the verdicts (`judge_step`), the judging passes that ask a
judge something more (`passes`: the grammar canary, the controls, judge sensitivity, the jury), the summary
(`summary`), the manifest (`manifest`). For the passes `Run` is a scheduler: for each engine it loads, it
drains every pass that needs that engine (their hooks, in the table's order), then loads each pass's own
models after the judge, one at a time. Placement: `sequential` generates with each
target, frees it, then loads the judge once; `colocate` keeps the judge resident beside each target in turn;
`sleep` does the same with vLLM sleep mode (the idle engine's weights offloaded; CUDA only, else it falls back
to sequential). The judge is loaded once for all targets of a sweep. Re-running the same config on the same
directory resumes. Constructing a `Run` checks everything and touches nothing; `execute` does the work.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from diagsafe_local.core import atomic, signing
from diagsafe_local.core.cache import file_sha256
from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines import Engine, capabilities, create_engine
from diagsafe_local.engines.base import local_model_path
from diagsafe_local.engines.host import Host
from diagsafe_local.engines.identity import EngineIdentity, engine_identity
from diagsafe_local.evaluation.attack.step import AttackStep, attacked_items
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.context import run_context
from diagsafe_local.evaluation.generation import Answer, generate_streams, generation_done
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.judge_step import (
    JudgeStep,
    answer_task,
    for_jury,
    judge_tasks,
    judged_turns,
    needs_engine,
    pending_tasks,
    unjudged,
)
from diagsafe_local.evaluation.manifest import build_manifest, dataset_ref, judge_ref, target_refs
from diagsafe_local.evaluation.passes import JUDGE, PASSES, JudgingPass, Seat, alongside, shares_engine
from diagsafe_local.evaluation.passes.base import Answers, Poll
from diagsafe_local.evaluation.planning import plan_run
from diagsafe_local.evaluation.prompt_sets import load_configured
from diagsafe_local.evaluation.run_directory import RunDirectory
from diagsafe_local.evaluation.sharding import Shard
from diagsafe_local.judging.base import JUDGES
from diagsafe_local.judging.cards import AUTO, auto_validation
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.runs.manifest import GrammarCanary, ValidationRef, write_manifest
from diagsafe_local.runs.passes import signed_files
from diagsafe_local.runs.records import AnswerKey, ControlRecord
from diagsafe_local.runs.summarize import Summarizer
from diagsafe_local.runs.summary import Reused, Summary, write_summary
from diagsafe_local.runs.validation import VALIDATION_FILE, JudgeValidation, validated_rates

log = logging.getLogger(__name__)
EngineFactory = Callable[..., Engine]


def judge_validation(judge: JudgeConfig, identity: EngineIdentity) -> tuple[JudgeValidation, ValidationRef] | None:
    """The measured error rates of this run's judge, from `judge.validation` (None when not set), and the
    manifest's record of where they came from, by content."""
    if not judge.validation:
        return None
    directory = auto_validation(judge) if judge.validation == AUTO else Path(judge.validation).resolve()
    if directory is None:  # auto, and none stored for this judge: as a run without a validation
        return None
    if judge.jury is not None:  # the jury is the judge of harmful items, validated as one
        rubric, key, scoring = judge.jury.label(), judge.jury.identity(), "sampled"
    else:
        rubric = judge.panel.label() if judge.panel else judge.rubric_name  # a panel is validated as one
        key, scoring = identity.key(), judge.scoring
    rates = validated_rates(directory, rubric, key, scoring)
    return rates, ValidationRef(
        directory=str(directory), sha256=file_sha256(directory / VALIDATION_FILE), rubric=rubric
    )


def missing_references(judge: JudgeConfig, items: Sequence[Item]) -> None:
    """Refuse, before anything runs, harmful items that a judge needing reference answers (a reference metric)
    cannot judge, naming them."""
    names = judge.panel.names() if judge.panel else [judge.rubric_name]
    names += [m.rubric_name for m in judge.jury.members] if judge.jury else []
    needing = [n for n in names if JUDGES.get(n).needs_reference]
    lacking = [item.id for item in items if not item.benign and not item.references]
    if needing and lacking:
        shown = ", ".join(lacking[:5]) + (f" and {len(lacking) - 5} more" if len(lacking) > 5 else "")
        raise DiagsafeError(
            f"judge '{needing[0]}' compares answers with reference answers, and item(s) {shown} have none: give "
            "them a `reference` (a text or a list), use a HarmMetric Eval file as the dataset, or another judge"
        )


def _step_judge(step: JudgeStep, beside: Poll | None) -> None:
    """One step of a resident judge: the run's verdicts and the passes' streams beside them (the controls)."""
    if beside is not None:
        beside()
    if step.pending:
        step.poll()


class Run:
    """Executes a RunConfig; `engine_factory` is swappable for tests. Construction checks the config, the items,
    the model paths and the judge's validation, and has no side effects."""

    def __init__(
        self,
        config: RunConfig,
        overwrite: bool = False,
        engine_factory: EngineFactory | None = None,
        shard: Shard | None = None,
        on_progress: Callable[[str, int, int, bool], None] | None = None,
    ) -> None:
        self.config = config
        self.on_progress = on_progress
        self.factory = engine_factory or create_engine
        self.shard = shard
        if shard is not None and config.judge.one_process is not None:
            raise DiagsafeError(
                f"{config.judge.one_process} does not run in shards: its sample is drawn from the whole dataset; run "
                "it as one process (placement.replicas: 1)"
            )
        self.dataset_items, self.dataset_path = load_configured(config.dataset)
        self.items = [item for item in self.dataset_items if shard is None or shard.owns(item.id)]
        missing_references(config.judge, self.items)
        attacker = config.attack.own_attacker if config.attack else None
        for engine in (
            *config.targets,
            *([config.judge] if config.judge.needs_model else []),
            *([attacker] if attacker else []),
            *(m for m in (config.judge.jury.members if config.judge.jury else []) if m.needs_model),
        ):
            if capabilities(engine.kind).local:
                local_model_path(engine.model)  # before the run directory exists: a typo leaves nothing behind
        self.judge_identity = engine_identity(config.judge)
        validated = judge_validation(config.judge, self.judge_identity)
        self.judge_validation: JudgeValidation | None = validated[0] if validated else None
        self.validation_ref: ValidationRef | None = validated[1] if validated else None
        self.run_id = config.fingerprint()
        self.dataset = dataset_ref(config, self.dataset_path, file_sha256(self.dataset_path), self.dataset_items)
        self.judge = judge_ref(config.judge, self.judge_identity)
        self.fresh = {"generations": 0, "judgments": 0}
        self.gpu_plan = plan_run(config, len(self.items), replicate=False)  # this process: tensor parallel only
        root = shard.directory(config.output_dir) if shard else Path(config.output_dir)
        self.dir = RunDirectory(config, root, overwrite)
        self.timings: dict[str, dict[str, float]] = {}
        self.grammar: GrammarCanary | None = None
        self.passes: list[JudgingPass] = [make() for make in PASSES]
        self.attacks: dict[str, AttackStep | None] = {}
        self.started: str | None = None
        placement = config.placement
        self.host = Host(
            placement.mode,
            placement.target_memory,
            placement.judge_memory,
            self.factory,
            plan=self.gpu_plan,
            processes=shard.count if shard else 1,
            process=shard.index if shard else 0,
            slots=Path(config.output_dir) / "shards" / ".slots",  # an endpoint's, shared by the run's shards
        )

    def prepare(self) -> None:
        """Take the run directory (lock, resume or replace what is there) and set up the engines' host; `execute`
        does it when not done before (a command that wants the directory first, for its log, calls it)."""
        if self.dir.lock is not None:
            return
        self.dir.open()
        previous = self.dir.previous
        self.timings = dict(previous.timings) if previous else {}
        self.started = (previous.started if previous else None) or datetime.now(UTC).isoformat()
        self.host.loaded = dict(previous.engines) if previous else {}  # what an earlier run loaded, until reloaded
        self.grammar = previous.grammar if previous and self.config.judge.constrained else None
        self.ctx = run_context(self.config, self.items, self.dir)

    def reporter(self, stage: str, rate: bool = True) -> Callable[[int, int], None] | None:
        report = self.on_progress
        return (lambda done, total: report(stage, done, total, rate)) if report else None

    # -- engines -------------------------------------------------------------------------------
    def _open_judge(self) -> Engine:
        backend = self.config.judge.structured_output_backend
        return self.host.open_judge(self.config.judge, backend, self._template_arguments(self.config.judge))

    def _template_arguments(self, config: JudgeConfig) -> dict[str, str]:
        """The chat template arguments of every judge of the run that renders through an engine loaded from
        `config` (served the same way: the judge, the passes' seats), each with the judge that sends it: the
        engine checks them all against its template when it loads."""
        judges = [self.config.judge, *(seat.config for judging in self.passes for seat in judging.seats(self))]
        return {a: j for c in judges if shares_engine(c, config) for a, j in c.template_arguments().items()}

    def _generation_done(self, target: TargetConfig) -> bool:
        return generation_done(self.ctx, target)

    def _open_target(self, target: TargetConfig) -> Engine:
        return self.host.open_target(f"target:{target.label}", target)

    def _generate(
        self,
        target: TargetConfig,
        judge: Engine | None = None,
        beside: Poll | None = None,
        opened: Engine | None = None,
    ) -> None:
        """Generate the target's missing answers; with a resident `judge` (colocated), each answer to be judged
        goes to the judge the moment it is final, and the two engines step in turn (the passes' streams too).
        `opened`: the target's engine, already loaded (and left loaded) for the attack that follows."""
        if self._generation_done(target):
            return
        engine = opened or self._open_target(target)
        step = JudgeStep(judge, self.ctx) if judge is not None else None
        try:
            start = time.perf_counter()
            n, replayed = generate_streams(
                engine,
                self.ctx,
                target,
                self.reporter(f"{target.label}: answering"),
                on_answers=(lambda answers: self._hand_to_judge(step, target, answers)) if step else None,
                on_poll=(lambda: _step_judge(step, beside)) if step else None,
            )
            if step is not None:
                while step.pending:
                    _step_judge(step, beside)
                self.fresh["judgments"] += step.done
            self.fresh["generations"] += n + replayed
            seconds = time.perf_counter() - start
            self.timings[target.label] = {
                "generation_seconds": round(seconds, 3),
                "answers_generated": n,
                "engine_calls": engine.calls,
                "answers_per_second": round(n / seconds, 3) if seconds else 0.0,
            }
            self.save_manifest("running")
        finally:
            if step is not None:
                step.close()
            if opened is None:
                engine.close()

    def _hand_to_judge(self, step: JudgeStep, target: TargetConfig, answers: list[Answer]) -> None:
        """Submit the judge's task for every answer just made that is judged (final turns, or every turn), with
        the conversation generation sent (nothing is read back from the store)."""
        for answer in answers:
            record, item = answer.record, self.ctx.items_by_id[answer.record.item_id]
            if record.error is not None or record.turn not in judged_turns(item, self.config.judge.turns):
                continue  # failed answers are recorded as errors by the judge step that follows
            task = answer_task(self.ctx, target, answer)
            if task is not None and not for_jury(self.config.judge, task):
                step.submit(task)

    def _needs_judge(self) -> bool:
        """Whether the judge model must be loaded (never for judges that need none)."""
        if not self.config.judge.needs_model:
            return False
        return (
            any(p.needs_judge(self) for p in self.passes)
            or any(self._needs_judge_model(t) for t in self.config.targets)
            or any(step is not None and not step.done() for step in self.attacks.values())
        )

    def _needs_judge_model(self, target: TargetConfig) -> bool:
        """Whether this target still needs the judge model (answers missing, or judgments a model must make)."""
        return not self._generation_done(target) or needs_engine(self.config.judge, pending_tasks(self.ctx, target))

    def _judge(self, engine: Engine | None, target: TargetConfig, beside: Poll | None) -> None:
        """Judge the target's answers that have no current verdict, streamed from the stores as the judge takes
        them (nothing holds them all)."""
        tasks = (t for t in pending_tasks(self.ctx, target) if not for_jury(self.config.judge, t))
        first = next(tasks, None)
        if first is None:
            return
        start = time.perf_counter()
        judged = judge_tasks(
            JudgeStep(engine, self.ctx),
            itertools.chain([first], tasks),
            self.reporter(f"{target.label}: judging, verdicts"),
            alongside=beside,
            total=unjudged(self.ctx, target),
        )
        self.fresh["judgments"] += judged
        seconds = time.perf_counter() - start
        self.timings.setdefault(target.label, {}).update(
            judge_seconds=round(seconds, 3), judgments_per_second=round(judged / seconds, 3) if seconds else 0.0
        )

    def _drain(self, judging: JudgingPass, seat: Seat, engine: Engine | None, work: object) -> None:
        """A pass's work on a seat whose engine is ready: every pass is told first (the canary asks it)."""
        for each in self.passes:
            each.start(self, seat, engine)
        judging.drain(self, seat, engine, work)

    def _ride(self, judge: Engine) -> None:
        """Every pass's seats that the judge's engine serves (the same model served the same way), drained while
        it is loaded: no model loads twice."""
        for judging in self.passes:
            for seat in judging.seats(self):
                if shares_engine(seat.config, self.config.judge):
                    work = judging.pending(self, seat)
                    if work is not None:
                        self._drain(judging, seat, judge, work)

    def _seats(self) -> None:
        """The passes' seats with work left, in the table's order, each model loaded alone and once (seats in a
        row served the same way share it); then each pass's `finish`."""
        held: tuple[Seat, Engine] | None = None  # the last seat's engine, kept for the next if it serves
        try:
            for judging in self.passes:
                for seat in judging.seats(self):
                    work = judging.pending(self, seat)
                    if work is None:
                        continue
                    engine: Engine | None = None
                    if seat.config.needs_model:
                        if held is None or not shares_engine(seat.config, held[0].config):
                            if held is not None:
                                held[1].close()
                                held = None
                            backend = seat.config.structured_output_backend
                            arguments = self._template_arguments(seat.config)
                            held = (seat, self.host.open_juror(seat.label, seat.config, backend, arguments))
                        engine = held[1]
                    self._drain(judging, seat, engine, work)
        finally:
            if held is not None:
                held[1].close()
        for judging in self.passes:
            judging.finish(self)

    # -- the run -------------------------------------------------------------------------------
    def execute(self) -> Summary:
        """Run (or resume) to completion; returns the summary."""
        self.prepare()
        try:
            return self._execute()
        finally:
            self.host.close()
            self.dir.close()

    def _settle(self) -> None:
        """Finish the passes' work in flight on the judge's engine."""
        for judging in self.passes:
            judging.settle()

    def _attack_step(self, target: TargetConfig) -> AttackStep | None:
        """The target's attack, its chains replayed from attacks.jsonl (None without `attack:`)."""
        return AttackStep(self.ctx, target) if self.config.attack is not None else None

    def _attack(self, target: TargetConfig, engine: Engine, judge: Engine | None, attacker: Engine | None) -> None:
        """Run the target's attack to its end, its engines resident (see `attack_step`)."""
        step = self.attacks[target.label]
        if step is None or step.done():
            return
        writer = attacker or judge  # the config guarantees one: the judge's model, or the attacker's own
        assert writer is not None
        start = time.perf_counter()
        counts = step.run(engine, writer, judge, on_progress=self.reporter(f"{target.label}: attacking, queries"))
        self.timings.setdefault(target.label, {}).update(
            attack_seconds=round(time.perf_counter() - start, 3),
            attack_rounds=counts.rounds,
            **{f"attack_{role}_steps": n for role, n in counts.steps.items()},
        )
        self.save_manifest("running")

    def _open_attacker(self) -> Engine | None:
        """A separate attacker model, loaded once for every target (None: none, or the judge's engine serves)."""
        attack = self.config.attack
        own = attack.own_attacker if attack else None
        if attack is None or own is None or all(s is None or s.done() for s in self.attacks.values()):
            return None
        return self.host.open_attacker(own, attack.memory, self.config.judge.structured_output_backend)

    def _execute(self) -> Summary:
        self.dir.write_config(self.run_id)
        self.save_manifest("running")
        self.attacks = {t.label: self._attack_step(t) for t in self.config.targets}
        targets = self.config.targets
        sequential = self.host.mode == "sequential"
        if sequential:  # every target generates (and is freed) before the judge loads
            for target in targets:
                self._generate(target)
        judge = self._open_judge() if self._needs_judge() else None
        attacker: Engine | None = None
        try:
            seat = Seat(JUDGE, JUDGE, self.config.judge)
            beside = alongside([poll for p in self.passes if (poll := p.start(self, seat, judge)) is not None])
            attacker = self._open_attacker()
            for target in targets:
                step = self.attacks[target.label]
                opened = self._open_target(target) if step is not None and not step.done() else None
                try:
                    if self.host.mode == "colocate":
                        self._generate(target, judge, beside, opened)  # the judge grades each answer as it comes
                    elif not sequential:
                        # vLLM's sleep aborts whatever is in flight: the passes' streams finish first.
                        self._settle()
                        self.host.park(judge)
                        self._generate(target)
                        self.host.unpark(judge)
                    self._judge(judge, target, beside)
                    for judging in self.passes:
                        judging.target_judged(self, judge, target)
                    if opened is not None:
                        self._attack(target, opened, judge, attacker)
                finally:
                    if opened is not None:
                        opened.close()
            self._settle()
            if judge is not None:
                self._ride(judge)  # the seats served by the judge's own engine (jury members), while it is loaded
        finally:
            for judging in self.passes:
                judging.close()
            if attacker is not None:
                attacker.close()
            if judge is not None:
                judge.close()
        self._seats()
        with atomic.outputs_together():  # results, summary and manifest change as one set
            return self._write_outputs()

    def _write_outputs(self) -> Summary:
        order = {item.id: k for k, item in enumerate(self.items)}
        targets = {t.label: k for k, t in enumerate(self.config.targets)}
        samples = {t.label: t.sampling.n for t in self.config.targets}
        judged = {i.id: set(judged_turns(i, self.config.judge.turns)) for i in self.items}
        turns = {i.id: i.n_turns for i in self.items}
        goals = {i.id for i in attacked_items(self.items)} if self.config.attack is not None else set()

        def key(k: AnswerKey) -> tuple[int, int, int, int]:
            return (targets.get(k[0], 99), order.get(k[1], 1 << 30), k[2], k[3])

        def wanted(k: AnswerKey) -> bool:  # of a target and an item the run has, a sample it draws
            return k[0] in targets and k[1] in order and 0 <= k[2] < samples[k[0]]

        def kept(k: AnswerKey) -> bool:  # an answer the run judges
            return wanted(k) and k[3] in judged[k[1]]

        # Records of items no longer in the dataset (or of turns no longer judged) leave the run.
        self.dir.generations.keep(lambda k: wanted(k) and 1 <= k[3] <= turns[k[1]])
        self.dir.results.keep(kept)
        self.dir.generations.compact(key)
        self.dir.results.compact(key)
        if self.config.attack is not None:
            self.dir.attacks.keep(lambda k: k[0] in targets and k[1] in goals)
            self.dir.attacks.compact(key)
        answers = Answers(kept, key)
        for judging in self.passes:
            judging.tidy(self, answers)
        reused = Reused(
            generations=len(self.dir.generations) - self.fresh["generations"],
            judgments=len(self.dir.results) - self.fresh["judgments"],
        )
        tokens: dict[str, int] = {}
        for generation in self.dir.generations.values():
            tokens[generation.target] = tokens.get(generation.target, 0) + generation.usage.completion_tokens
        for label, timing in self.timings.items():
            if "answers_generated" in timing:
                timing["completion_tokens"] = tokens.get(label, 0)
        summarizer = Summarizer(
            self.judge_validation,
            self.config.attack.ref() if self.config.attack else None,
            self.judge.instructions,
            self.timings,
        )
        for record in self.dir.results.values():  # read back one at a time: a run's records are never all held
            summarizer.add(record)
        for step in self.dir.attacks.values():
            summarizer.add_attack_step(step)
        summarizer.controls = list(self.dir.store(ControlRecord).values())
        summary = summarizer.summary()
        summary = write_summary(self.dir.root, summary.model_copy(update={"run_id": self.run_id, "reused": reused}))
        self.save_manifest("complete")
        return summary

    def save_manifest(self, status: Literal["running", "complete"]) -> None:
        manifest = build_manifest(
            self.config,
            status,
            run_id=self.run_id,
            started=self.started,
            dataset=self.dataset,
            judge=self.judge,
            targets=target_refs(self.config, self.ctx.identities),
            shard=self.shard,
            engines=self.host.loaded,
            gpu_plan=self.gpu_plan,
            timings=self.timings,
            validation=self.validation_ref,
            grammar=self.grammar,
            resumed=self.dir.previous,
        )
        write_manifest(self.dir.root, manifest)
        # Signed at every save (where a key is set): a resumed run reuses only what was signed.
        signing.sign(self.dir.root, self.run_id, signed_files())
