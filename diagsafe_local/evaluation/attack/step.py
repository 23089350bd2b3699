"""The pipeline's attack step: adaptive attacks on a target, every chain of every goal advancing on its own.

Three request streams, one per role: the attacker's (its next prompt), the target's (its answer) and the judge's
(`judge_step.JudgeStep`, so panels, reasoning judges and retries work as in the run). A chain's attacker request
goes in the moment the judge's verdict on its last answer is in; nothing waits for the other chains of its depth
or turn. When attacker and judge are one model on one engine, their two streams share it (`VLLMStream`). With
`barrier=True` (the benchmark's comparison) each role's requests wait until nothing is in flight anywhere, the
way a per-iteration loop runs an attack.

Each judged step is appended to attacks.jsonl (a `ResultRecord` with `attack`) as soon as its verdict is in. A
killed run resumes: each chain's recorded steps are replayed through the strategy's `advance` (the same code that
made them), so it continues at the step it stopped at and never repeats a recorded one; steps made for another
model, attacker, judge or config (by `chain_key`) are dropped and redone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Completion, Engine
from diagsafe_local.engines.streams import open_stream
from diagsafe_local.evaluation.attack.prompts import attacker_schema, parse_attacker
from diagsafe_local.evaluation.attack.strategy import STRATEGIES, Chain, Step, Strategy
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.context import RunContext
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.judge_step import JudgeStep, JudgeTask, judge_key
from diagsafe_local.runs.records import AttackInfo, GenerationRecord, ResultRecord, Usage
from diagsafe_local.runs.refusal import is_refusal

ChainId = tuple[str, int]  # (item id, stream)


def goal_of(item: Item) -> str:
    """An item's goal: its last user turn."""
    return item.messages[item.user_positions[-1]].content


def attacked_items(items: Sequence[Item]) -> list[Item]:
    """The items an attack targets: the harmful ones."""
    return [item for item in items if not item.benign]


@dataclass
class _Pending:
    """A chain's step in flight: what the attacker was asked, and what it wrote."""

    step: int
    prompt: str = ""
    improvement: str = ""
    attacker_usage: Usage = field(default_factory=Usage)
    conversation: tuple[Message, ...] = ()


@dataclass
class _Goal:
    item: Item
    chains: list[Chain]
    queries: int = 0  # target queries made or in flight (the budget is reserved as a chain asks its attacker)
    made: int = 0  # target queries answered: what progress counts (a failed attacker request made none)
    broken: bool = False


@dataclass
class AttackCounts:
    """Steps each role's stream worked in, and the loop's rounds (the wall in steps when engines run side by
    side)."""

    rounds: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {"attacker": 0, "target": 0, "judge": 0})
    records: int = 0


class AttackStep:
    """Attack one target's harmful items with `attack` (see the module docstring)."""

    def __init__(self, ctx: RunContext, target: TargetConfig) -> None:
        attack = ctx.config.attack
        assert attack is not None
        self.ctx = ctx
        self.attack = attack
        self.strategy: Strategy = STRATEGIES.get(attack.strategy)
        self.target = target
        self.store = ctx.directory.attacks
        self.rubric = ctx.config.judge.judge_for(False)
        self.judge_settings = ctx.judge_settings(self.rubric)
        self.goals = {item.id: _Goal(item, []) for item in attacked_items(ctx.items)}
        attacker = ctx.attacker_identity.key() if ctx.attacker_identity else {"attacker": "judge"}
        self.chain_keys = {
            item_id: content_key(
                attack,
                ctx.identities[target.label].key(),
                target.system_prompt,
                target.sampling,
                self.judge_settings,
                attacker,
                goal_of(goal.item),
            )
            for item_id, goal in self.goals.items()
        }
        self._pending: dict[ChainId, _Pending] = {}
        self._replay()

    # -- state from the records ----------------------------------------------------------------------
    def _replay(self) -> None:
        """Each chain's recorded steps, in order, through the strategy; records that do not continue a chain
        (another chain key, a gap) are dropped, to be redone."""
        label = self.target.label
        mine: dict[ChainId, dict[int, ResultRecord]] = {}
        for stored in self.store.values():
            if stored.target == label and stored.item_id in self.goals and stored.attack is not None:
                mine.setdefault((stored.item_id, stored.sample), {})[stored.turn] = stored
        kept = {key for key in self.store.keys() if key[0] != label}  # (target, item, sample, turn)
        for item_id, goal in self.goals.items():
            for stream in range(self.attack.streams):
                chain = Chain(goal=goal_of(goal.item), stream=stream)
                goal.chains.append(chain)
                recorded = mine.get((item_id, stream), {})
                for n in range(1, len(recorded) + 1):
                    record = recorded.get(n)
                    if record is None or record.attack.chain_key != self.chain_keys[item_id] or chain.end:  # type: ignore[union-attr]
                        break
                    step = self._step(record)
                    self.strategy.advance(chain, step, self.attack)
                    kept.add(record.key)
                    goal.queries += record.attack.queried  # type: ignore[union-attr]
                    goal.made += record.attack.queried  # type: ignore[union-attr]
                    goal.broken |= chain.end == "success"
        self.store.keep(kept.__contains__)

    @staticmethod
    def _step(record: ResultRecord) -> Step:
        info = record.attack
        assert info is not None
        return Step(
            step=record.turn,
            prompt=info.attacker_prompt,
            answer=record.answer,
            score=record.score,
            refused=info.refused,
            error=record.error if info.end == "error" else None,
        )

    def done(self) -> bool:
        """Whether every goal is finished: broken, its budget spent, or every chain ended."""
        return all(self._goal_done(goal) for goal in self.goals.values())

    def _goal_done(self, goal: _Goal) -> bool:
        return goal.broken or goal.queries >= self.attack.query_budget or all(c.end for c in goal.chains)

    # -- the loop ------------------------------------------------------------------------------------
    def run(
        self,
        target_engine: Engine,
        attacker_engine: Engine,
        judge_engine: Engine | None,
        barrier: bool = False,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> AttackCounts:
        """Run every unfinished chain to its end; returns the steps each role worked."""
        counts = AttackCounts()
        self._held: list[Callable[[], None]] = []
        self._barrier = barrier
        self._attacker = open_stream(attacker_engine)
        self._target = open_stream(target_engine)
        self._judge = JudgeStep(judge_engine, self.ctx, self.store, finish=self._judged)
        self._next: list[ChainId] = []
        total = len(self.goals) * self.attack.query_budget
        try:
            for goal in self.goals.values():
                for chain in goal.chains:
                    self._continue(goal, chain)
            if on_progress:
                on_progress(sum(g.made for g in self.goals.values()), total)
            while self._in_flight() or self._held:
                if not self._in_flight():  # barrier: everything held goes in together
                    held, self._held = self._held, []
                    for submit in held:
                        submit()
                counts.rounds += 1
                for role in self._to_step():
                    counts.steps[role] += 1
                    if role == "judge":
                        counts.records += self._judge.poll()
                        for chain_id in self._next:
                            goal = self.goals[chain_id[0]]
                            self._continue(goal, goal.chains[chain_id[1]])
                        self._next = []
                        if on_progress:
                            on_progress(sum(g.made for g in self.goals.values()), total)
                    else:
                        stream = self._attacker if role == "attacker" else self._target
                        for chain_id, completion in stream.poll():
                            (self._attacked if role == "attacker" else self._answered)(chain_id, completion)
        finally:
            self._attacker.close()
            self._target.close()
            self._judge.close()
        return counts

    def _pending_by_role(self) -> dict[str, int]:
        return {"attacker": self._attacker.pending, "target": self._target.pending, "judge": self._judge.pending}

    def _to_step(self) -> list[str]:
        """The roles whose streams this round polls: every role with requests in flight (with a barrier, only
        one phase has any). A chain never waits for the others of its depth or turn; an engine with a few long
        answers left steps for them while the other engines work on the chains that are done with it."""
        return [role for role, n in self._pending_by_role().items() if n]

    def _in_flight(self) -> bool:
        return any(self._pending_by_role().values())

    def _send(self, submit: Callable[[], None]) -> None:
        if self._barrier:
            self._held.append(submit)
        else:
            submit()

    def _continue(self, goal: _Goal, chain: Chain) -> None:
        """Ask the attacker for the chain's next prompt, unless the chain or its goal is finished (a query of
        the goal's budget is reserved now)."""
        if chain.end or goal.broken or goal.queries >= self.attack.query_budget:
            return
        goal.queries += 1
        chain_id = (goal.item.id, chain.stream)
        self._pending[chain_id] = _Pending(step=chain.next_step)
        sampling = self.attack.sampling
        request = sampling.request(
            self.strategy.attacker_messages(chain, self.attack),
            "attacker",
            self.target.label,
            *chain_id,
            chain.next_step,
            json_schema=attacker_schema(sampling.max_tokens),
        )
        self._send(lambda: self._attacker.submit(chain_id, request))

    def _attacked(self, chain_id: ChainId, completion: Completion) -> None:
        goal = self.goals[chain_id[0]]
        chain = goal.chains[chain_id[1]]
        pending = self._pending[chain_id]
        pending.attacker_usage = Usage.of(completion)
        parsed = parse_attacker(completion)
        if isinstance(parsed, str):  # the attacker failed: the chain ends, recorded, and its query is returned
            goal.queries -= 1
            self._to_judge(chain_id, None, parsed)
            return
        if goal.broken:  # a sibling broke the goal meanwhile: this chain stops here
            goal.queries -= 1
            del self._pending[chain_id]
            return
        pending.improvement, pending.prompt = parsed
        pending.conversation = self.strategy.target_messages(chain, pending.prompt, self.target.system_prompt)
        request = self.target.sampling.request(
            pending.conversation, "attack", self.target.label, *chain_id, pending.step
        )
        self._send(lambda: self._target.submit(chain_id, request))

    def _answered(self, chain_id: ChainId, completion: Completion) -> None:
        self.goals[chain_id[0]].made += 1
        error = None if completion.error is None else f"target: {completion.error}"
        self._to_judge(chain_id, completion, error)

    def _to_judge(self, chain_id: ChainId, completion: Completion | None, error: str | None) -> None:
        goal = self.goals[chain_id[0]]
        pending = self._pending[chain_id]
        item, stream = goal.item, chain_id[1]
        generation = None
        if completion is not None and error is None:
            generation = GenerationRecord(
                target=self.target.label,
                item_id=item.id,
                sample=stream,
                turn=pending.step,
                answer=completion.text,
                finish_reason=completion.finish_reason,
                usage=Usage.of(completion),
            )
        judged = (Message(role="user", content=goal_of(item)),)
        task = JudgeTask(
            target=self.target.label,
            system_prompt=self.target.system_prompt,
            item=item,
            sample=stream,
            turn=pending.step,
            generation=generation,
            conversation=pending.conversation,
            error=error,
            key=judge_key(self.judge_settings, self.rubric, judged, generation.answer, item.references)
            if generation
            else None,
            judged=judged,
        )
        self._send(lambda: self._judge.submit(task))

    def _judged(self, task: JudgeTask, record: ResultRecord) -> ResultRecord:
        """A step's verdict is in: advance its chain, and complete its record with the attack step."""
        chain_id = (task.item.id, task.sample)
        goal = self.goals[chain_id[0]]
        chain = goal.chains[chain_id[1]]
        pending = self._pending.pop(chain_id)
        step = Step(
            step=pending.step,
            prompt=pending.prompt,
            answer=record.answer,
            score=record.score,
            refused=task.generation is not None and is_refusal(record.answer),
            error=task.error,
        )
        outcome = self.strategy.advance(chain, step, self.attack)
        goal.broken |= outcome.end == "success"
        if not chain.end:
            self._next.append(chain_id)
        info = AttackInfo(
            strategy=self.strategy.name,
            goal=chain.goal,
            stream=chain.stream,
            step=pending.step,
            depth=outcome.depth,
            turn=outcome.turn,
            parent=outcome.parent,
            attacker_prompt=pending.prompt,
            improvement=pending.improvement,
            backtracked=outcome.backtracked,
            refused=step.refused,
            end=outcome.end,
            chain_key=self.chain_keys[goal.item.id],
            attacker_usage=pending.attacker_usage,
        )
        return record.model_copy(update={"attack": info})
