"""One run's context: what every step of a run reads, built once when the run takes its directory and passed
whole (the config, the run id, this process's items, each model's identity by content, how records name the
engines, the run directory's stores) instead of as a dozen loose parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.identity import EngineIdentity, engine_identity
from diagsafe_local.evaluation.config import RunConfig, TargetConfig
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.run_directory import RunDirectory
from diagsafe_local.judging.config import JuryMember
from diagsafe_local.runs.records import EngineRef


def engine_ref(config: EngineConfig) -> EngineRef:
    """How records name an engine (no secrets); a judge without a model is kind 'none'."""
    if config.model is None:
        return EngineRef(kind="none", model="none")
    return EngineRef(kind=config.kind, model=config.model, lora=config.lora, base_url=config.base_url)


@dataclass(frozen=True)
class RunContext:
    """What the steps of one run share (see the module docstring)."""

    config: RunConfig
    run_id: str
    items: tuple[Item, ...] = field(repr=False)
    identities: Mapping[str, EngineIdentity]
    judge_identity: EngineIdentity
    attacker_identity: EngineIdentity | None
    target_refs: Mapping[str, EngineRef]
    judge_ref: EngineRef
    directory: RunDirectory = field(repr=False)
    juror_identities: Mapping[str, EngineIdentity] = field(default_factory=dict)

    @cached_property
    def items_by_id(self) -> dict[str, Item]:
        return {item.id: item for item in self.items}

    @cached_property
    def targets(self) -> dict[str, TargetConfig]:
        """The targets by label."""
        return {t.label: t for t in self.config.targets}

    def judge_settings(self, rubric: str) -> dict[str, Any]:
        """Everything that decides a verdict of `rubric` besides what the judge is shown: the judge's model by
        content and its verdict settings (the key a stored verdict is reused by starts here)."""
        jury = self.config.judge.jury
        if jury is not None and rubric == jury.label():
            return {"jury": {m.label: self.juror_settings(m) for m in jury.members}}
        return {**self.judge_identity.key(), **self.config.judge.verdict_settings(rubric)}

    def juror_settings(self, member: JuryMember) -> dict[str, Any]:
        """What decides a jury member's verdicts besides what it is shown: its model by content and settings."""
        return {**self.juror_identities[member.label].key(), **member.verdict_settings(member.rubric_name)}


def run_context(config: RunConfig, items: Sequence[Item], directory: RunDirectory) -> RunContext:
    """The context of a run of `config` over `items` (this process's share) in an opened run directory: each
    model's identity by content (what a resumed run may reuse is decided by content keys, not by paths)."""
    attacker = config.attack.own_attacker if config.attack else None
    return RunContext(
        config=config,
        run_id=config.fingerprint(),
        items=tuple(items),
        identities={t.label: engine_identity(t) for t in config.targets},
        judge_identity=engine_identity(config.judge),
        attacker_identity=engine_identity(attacker) if attacker else None,
        target_refs={t.label: engine_ref(t) for t in config.targets},
        judge_ref=engine_ref(config.judge),
        directory=directory,
        juror_identities={
            m.label: engine_identity(m) for m in (config.judge.jury.members if config.judge.jury else [])
        },
    )
