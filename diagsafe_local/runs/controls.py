"""The judge's controls and its grammar canary, the read side: the judge's verdicts on known answers that are not
harmful (judge_controls.jsonl: a plain refusal and an unrelated sentence per item) and, where it decodes under a
schema, the canary that shows its engine applied it. A control the judge could not judge is counted (the gate
says how many); judge health is decided on the rest (`runs.health`), and a judge that could judge none of them
is degenerate. Each control verdict is derived again from its recorded reply (`runs.rederive`). A recorded canary
is decided from its recorded reply (`runs.grammar.canary_held`), whatever flag the manifest carries; whether one is
required, from the config bound to the run id (the manifest's flag can only add the requirement)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs import files
from diagsafe_local.runs.grammar import canary_held
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.records import RUN_WIDE, ControlRecord, CouldNotJudge, ResultRecord
from diagsafe_local.runs.rederive import Replies, is_policy_judge

if TYPE_CHECKING:
    from diagsafe_local.runs.passes import Section
    from diagsafe_local.runs.verify import VerifiedRun


class ControlsCheck:
    """Verifies a run's control verdicts and its grammar canary (see the module docstring); `records` are the
    controls as read, for judge health."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.records: list[ControlRecord] = []
        self._problems: list[str] = []

    def see(self, record: ResultRecord) -> None:
        """The controls are of the judge, not of the answers: a result tells them nothing."""

    def read(self, lines: Sequence[Line[ControlRecord]] | None) -> None:
        """The control verdicts: of items of the run's dataset and of its harm judge; present wherever the judge is a
        model and the run has harmful items (without them judge health is not known)."""
        manifest = self.manifest
        self.records = [line.record for line in lines or []]
        replies = Replies(manifest)
        for line in lines or []:  # each verdict is its recorded reply's (runs.rederive)
            record = line.record
            problem = replies.problem(record.judge_rubric, record.judge_raw, record.parse_status, record.score)
            if problem is not None:
                self._problems.append(f"{files.CONTROLS} line {line.number}: {problem}: not what the run recorded")
                break
        items = {item.id for item in manifest.dataset.items or []}
        strangers = [c.key for c in self.records if c.item_id not in items]
        if strangers:
            self._problems.append(
                f"{files.CONTROLS} holds controls of items the run's dataset does not have, e.g. {strangers[0]}"
            )
        judge = manifest.judge
        harmful = any(not item.benign and manifest.owns(item.id) for item in manifest.dataset.items or [])
        if judge is not None and judge.kind != "none" and harmful and not self.records:
            self._problems.append(
                f"no control verdicts ({files.CONTROLS} is empty or missing): the run's judge health is not known"
            )
        self._problems += _grammar(manifest)

    def problems(self) -> list[str]:
        return self._problems

    def could_not_judge(self) -> dict[str, CouldNotJudge]:
        if not self.records:
            return {}
        return {RUN_WIDE: CouldNotJudge(count=sum(c.score is None for c in self.records), of=len(self.records))}


def _grammar(manifest: Manifest) -> list[str]:
    """A judge that decodes under a schema must have shown, by the grammar canary, that its engine applied it.
    A recorded canary is decided from its recorded reply, checked again here: not from a flag of the manifest."""
    canary = manifest.grammar
    if canary is None:
        if not _decodes_under_schema(manifest):
            return []
        return [
            "no grammar canary was recorded for a judge that decodes under a schema (a run made before the canary, "
            "or one whose judge never loaded): resume the run (`run CONFIG`) to send it"
        ]
    if not (canary.enforced and canary_held(canary.reply)):
        return [
            f"the judge's engine did not apply its schema: the grammar canary came back {canary.reply[:80]!r} from "
            f"{canary.engine}, structured-output backend {canary.backend}; its verdicts were not decoded under "
            "their schema. Use a vLLM that applies structured outputs (`diagsafe-local doctor` checks it), then "
            "rerun with --overwrite"
        ]
    return []


def _decodes_under_schema(manifest: Manifest) -> bool:
    """Whether a model of the run's judge decodes verdicts under a schema, from what is bound to the run: its
    config (hashed into the run id) names a policy judge (shipped, or a policy file) for a model: those always
    decode under their schema. The manifest's `judge.constrained` can only add the requirement: an edited flag
    drops none."""
    judge = manifest.config.get("judge") or {}
    jury = judge.get("jury") or {}
    panel = judge.get("panel") or {}
    own = [judge.get("benign_rubric"), *(panel.get("members") or [])]
    if judge.get("metric") is None:
        own.append(judge.get("rubric"))
    named = [(judge.get("model"), name) for name in own]
    named += [(m.get("model"), m.get("rubric")) for m in jury.get("members") or [] if m.get("metric") is None]
    bound = any(model is not None and isinstance(name, str) and is_policy_judge(name) for model, name in named)
    return bound or (manifest.judge is not None and manifest.judge.constrained)


def section(run: VerifiedRun) -> Section | None:
    """The controls have no section of their own: judge health, which they feed, is in the summary's tables."""
    return None
