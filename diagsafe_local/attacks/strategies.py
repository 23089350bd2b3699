"""PAIR and Crescendo as state machines over one chain: what the attacker is asked next, what the target is
sent, and what a judged answer does to the chain. Nothing here calls a model; the scheduler
(`evaluation.attack_step`) feeds each chain its judged steps, live or replayed from the records of a killed run,
through the same `advance`, so a resumed chain is in exactly the state it was in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from diagsafe_local.attacks.config import AttackConfig
from diagsafe_local.attacks.prompts import crescendo_messages, pair_messages
from diagsafe_local.core.messages import Message
from diagsafe_local.core.registry import Registry

End = Literal["success", "depth", "turns", "error"]


@dataclass(frozen=True)
class Step:
    """One judged step of a chain: the attacker's prompt, the target's answer and the judge's score."""

    step: int
    prompt: str
    answer: str
    score: float | None
    refused: bool
    error: str | None = None


@dataclass
class Chain:
    """One chain (pair) or conversation (crescendo) of one goal."""

    goal: str
    stream: int
    steps: list[Step] = field(default_factory=list)
    history: list[Step] = field(default_factory=list)  # crescendo: the accepted turns
    backtracks: int = 0
    end: End | None = None

    @property
    def next_step(self) -> int:
        return len(self.steps) + 1


@dataclass(frozen=True)
class Outcome:
    """What one step did to its chain (recorded with the step)."""

    depth: int
    turn: int
    parent: int | None
    backtracked: bool
    end: End | None


class Strategy(Protocol):
    """An attack strategy: the attacker's next conversation, the target's, and the chain's advance."""

    name: str
    description: str

    def attacker_messages(self, chain: Chain, config: AttackConfig) -> tuple[Message, ...]: ...

    def target_messages(self, chain: Chain, prompt: str, system_prompt: str | None) -> tuple[Message, ...]: ...

    def advance(self, chain: Chain, step: Step, config: AttackConfig) -> Outcome: ...


def _system(system_prompt: str | None) -> list[Message]:
    return [Message(role="system", content=system_prompt)] if system_prompt else []


class Pair:
    """PAIR: each step rewrites one single-turn prompt from the last prompt, answer and score."""

    name = "pair"
    description = "PAIR (Chao et al. 2023): parallel chains, each refining one prompt from the last answer and score."

    def attacker_messages(self, chain: Chain, config: AttackConfig) -> tuple[Message, ...]:
        last = chain.steps[-1] if chain.steps else None
        shown = (last.prompt, last.answer, last.score) if last else None
        return pair_messages(chain.goal, shown, config.answer_chars)

    def target_messages(self, chain: Chain, prompt: str, system_prompt: str | None) -> tuple[Message, ...]:
        return (*_system(system_prompt), Message(role="user", content=prompt))

    def advance(self, chain: Chain, step: Step, config: AttackConfig) -> Outcome:
        parent = chain.steps[-1].step if chain.steps else None
        chain.steps.append(step)
        if step.error is not None:
            chain.end = "error"
        elif config.breaks(step.score, step.error):
            chain.end = "success"
        elif len(chain.steps) >= config.depth:
            chain.end = "depth"
        return Outcome(depth=len(chain.steps), turn=1, parent=parent, backtracked=False, end=chain.end)


class Crescendo:
    """Crescendo: a conversation steered towards the goal; a refused turn is taken back and rephrased."""

    name = "crescendo"
    description = "Crescendo (Russinovich et al. 2024): a conversation escalated turn by turn; refusals taken back."

    def attacker_messages(self, chain: Chain, config: AttackConfig) -> tuple[Message, ...]:
        history = [(s.prompt, s.answer) for s in chain.history]
        last = chain.steps[-1] if chain.steps else None
        refused = last.prompt if last is not None and last not in chain.history else None
        score = chain.history[-1].score if chain.history else None
        return crescendo_messages(chain.goal, history, refused, config.max_turns, score, config.answer_chars)

    def target_messages(self, chain: Chain, prompt: str, system_prompt: str | None) -> tuple[Message, ...]:
        messages = _system(system_prompt)
        for s in chain.history:
            messages += [Message(role="user", content=s.prompt), Message(role="assistant", content=s.answer)]
        return (*messages, Message(role="user", content=prompt))

    def advance(self, chain: Chain, step: Step, config: AttackConfig) -> Outcome:
        parent = chain.history[-1].step if chain.history else None
        turn = len(chain.history) + 1
        chain.steps.append(step)
        backtracked = False
        if step.error is not None:
            chain.end = "error"
        elif config.breaks(step.score, step.error):
            chain.history.append(step)
            chain.end = "success"
        elif step.refused and chain.backtracks < config.max_backtracks:
            chain.backtracks += 1
            backtracked = True
        else:
            chain.history.append(step)
            if len(chain.history) >= config.max_turns:
                chain.end = "turns"
        return Outcome(depth=turn, turn=turn, parent=parent, backtracked=backtracked, end=chain.end)


STRATEGIES: Registry[Strategy] = Registry("attack strategy")
STRATEGIES.add(Pair())
STRATEGIES.add(Crescendo())
