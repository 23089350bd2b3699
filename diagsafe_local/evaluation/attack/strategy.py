"""What an attack strategy is, and their registry.

A strategy is a state machine over one chain: what the attacker is asked next, what the target is sent, and what
a judged answer does to the chain. Nothing here calls a model; the scheduler (`step`) feeds each chain its judged
steps, live or replayed from the records of a killed run, through the same `advance`, so a resumed chain is in
exactly the state it was in. Each strategy owns its knobs (`config`, a subclass of `AttackConfig`).

Built-ins and plugins register the same way: an entry point in the group `diagsafe_local.attack_strategies`
naming the strategy object (the built-ins' are in this package's own metadata), so a new strategy costs its own
module and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from diagsafe_local.core.messages import Message
from diagsafe_local.core.registry import Registry
from diagsafe_local.evaluation.attack.config import AttackConfig


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
    """One chain (or conversation) of one goal; `end` says why it stopped (`success` and `error` for every
    strategy; a strategy's own reasons besides, e.g. pair's `depth`)."""

    goal: str
    stream: int
    steps: list[Step] = field(default_factory=list)
    history: list[Step] = field(default_factory=list)  # the accepted turns, for strategies that take some back
    backtracks: int = 0
    end: str | None = None

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
    end: str | None


class Strategy(Protocol):
    """An attack strategy: its config (its knobs), the attacker's next conversation, the target's, and the
    chain's advance."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def config(self) -> type[AttackConfig]: ...

    def attacker_messages(self, chain: Chain, config: Any) -> tuple[Message, ...]: ...

    def target_messages(self, chain: Chain, prompt: str, system_prompt: str | None) -> tuple[Message, ...]: ...

    def advance(self, chain: Chain, step: Step, config: Any) -> Outcome: ...


def system_turn(system_prompt: str | None) -> list[Message]:
    """The target's system message, where it has one."""
    return [Message(role="system", content=system_prompt)] if system_prompt else []


def _entry(obj: Any, name: str) -> Iterable[Strategy]:
    strategy = obj() if isinstance(obj, type) else obj
    for needed in ("name", "description", "config", "attacker_messages", "target_messages", "advance"):
        if not hasattr(strategy, needed):
            raise TypeError(f"an attack strategy needs '{needed}'")
    if not (isinstance(strategy.config, type) and issubclass(strategy.config, AttackConfig)):
        raise TypeError(
            "an attack strategy's config must subclass diagsafe_local.evaluation.attack.config.AttackConfig"
        )
    return [strategy]


STRATEGIES: Registry[Strategy] = Registry(
    "attack strategy", plugin_group="diagsafe_local.attack_strategies", adapt=_entry
)


def attack_config(data: Any) -> Any:
    """A run config's `attack:` section validated by the config of the strategy it names (an unknown strategy is
    an error at `attack.strategy`, naming the known ones)."""
    if not isinstance(data, dict):
        return data
    import difflib

    from pydantic import ValidationError

    name = data.get("strategy")
    if name not in STRATEGIES:
        close = difflib.get_close_matches(str(name), STRATEGIES.names(), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        message = f"unknown attack strategy {name!r} (known: {', '.join(STRATEGIES.names())}){hint}"
        error = {"type": "value_error", "loc": ("strategy",), "input": name, "ctx": {"error": ValueError(message)}}
        raise ValidationError.from_exception_data("AttackConfig", [error])  # type: ignore[list-item]
    return STRATEGIES.get(str(name)).config.model_validate(data)
