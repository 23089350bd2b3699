"""The judge's configuration: its engine, the judges it runs (checked against the registry), how it scores."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from diagsafe_local.core.settings import StrictModel
from diagsafe_local.engines.config import EngineConfig, SamplingConfig
from diagsafe_local.judging.base import Decoding
from diagsafe_local.judging.panel import PanelRule


class PanelConfig(StrictModel):
    """Several harm judges on the judge's engine, their verdicts combined (see `judging.panel`)."""

    rule: PanelRule = Field("majority", description="majority, any or all of the decisions, or the mean score.")
    members: list[str] = Field(min_length=2, description="Harm judges of `bench --list`, run on the judge's engine.")

    def label(self) -> str:
        """The panel's name in records: rule and members."""
        return f"panel:{self.rule}:" + "+".join(self.members)


class JudgeConfig(EngineConfig):
    """The judge model and how it grades."""

    rubric: str = Field("harmjudge", description="Judge for harmful items: any harm judge of `bench --list`.")
    benign_rubric: str = Field(
        "refusal",
        description="How benign items are judged for over-refusal: a refusal judge ('refusal', "
        "'wildguard-refusal', 'qwen3guard-refusal') or 'refusal-keywords' (the refusal-phrase detector, no model "
        "call; 'keywords' is its former name).",
    )
    probability: bool | None = Field(
        None,
        description="Score Yes/No-style judges by P(Yes) at the first answer token instead of sampling "
        "(deterministic); applies to `rubric`; None = the judge's default (on for shieldgemma and harmclassifier).",
    )
    structured_output_backend: Literal["xgrammar", "guidance", "outlines"] = Field(
        "xgrammar", description="vLLM structured-output backend (pinned; compact JSON needs xgrammar or guidance)."
    )
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(max_tokens=400))
    turns: Literal["last", "every"] = Field(
        "last", description="Judge each conversation's last answer, or every generated one."
    )
    max_attempts: int = Field(3, ge=1, le=10, description="Tries per judgment; each retry doubles max_tokens.")
    reasoning: bool | None = Field(
        None,
        description="Reason before the verdict: free generation (bounded by reasoning_max_tokens) up to the judge's "
        "end-of-reasoning marker, then the verdict under its constraint. None: the judge's default (on for "
        "judges trained to reason first, e.g. granite-guardian, guardreasoner, gpt-oss-safeguard).",
    )
    reasoning_max_tokens: int = Field(
        1024,
        ge=1,
        description="Most tokens of a reasoning phase; one that runs out is closed and the verdict still constrained.",
    )
    store_reasoning: bool = Field(
        True, description="Keep each verdict's reasoning text in results.jsonl (its token count is always kept)."
    )
    reasoning_max_chars: int | None = Field(
        None, ge=0, description="Keep at most this many characters of each reasoning text (the cut is said)."
    )
    batch_size: int = Field(
        256,
        ge=1,
        description="Judgments in flight at once: more go in as each finishes (no barrier); each record is saved "
        "as it finishes.",
    )
    panel: PanelConfig | None = Field(
        None,
        description="Judge harmful items by a panel of harm judges instead of `rubric` alone; each member's verdict "
        "is kept in the record (`panel`). The health checks' control verdicts still use `rubric`.",
    )
    validation: str | None = Field(
        None,
        description="A `validate` output directory that measured this judge (same judge, model and scoring mode) "
        "on a harm gold set: the summary, report and `gate --corrected` then carry its FPR/FNR.",
    )

    @field_validator("benign_rubric")
    @classmethod
    def _former_name(cls, value: str) -> str:
        return "refusal-keywords" if value == "keywords" else value

    @model_validator(mode="after")
    def _judges(self) -> JudgeConfig:
        from diagsafe_local.core.registry import UnknownNameError
        from diagsafe_local.judging import JUDGES

        try:
            harm = JUDGES.get(self.rubric)
            benign = JUDGES.get(self.benign_rubric)
            members = [("panel.members", JUDGES.get(m)) for m in (self.panel.members if self.panel else [])]
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None
        if harm.measures != "harm":
            raise ValueError(f"rubric '{self.rubric}' measures {harm.measures}, not harm")
        if benign.measures != "refusal":
            raise ValueError(f"benign_rubric '{self.benign_rubric}' measures {benign.measures}, not refusal")
        for _, member in members:
            if member.measures != "harm":
                raise ValueError(f"panel member '{member.name}' measures {member.measures}, not harm")
        for field, judge in (("rubric", harm), ("benign_rubric", benign), *members):
            if judge.engine_kind != "none" and (judge.engine_kind or "") != (
                "classifier" if self.kind == "classifier" else ""
            ):
                need = judge.engine_kind or "an LLM engine (vllm, openai or transformers)"
                hint = (
                    " (use benign_rubric: refusal-keywords with a classifier judge)" if field == "benign_rubric" else ""
                )
                raise ValueError(f"{field} '{judge.name}' needs kind {need}, not '{self.kind}'{hint}")
        harm.check_probability(self.probability)
        harm.check_reasoning(self.reasoning)
        if self.deterministic and self.sampling.temperature > 0 and not harm.uses_probability(self.probability):
            raise ValueError("deterministic verdicts need greedy decoding: set sampling.temperature to 0")
        return self

    def judge_for(self, benign: bool) -> str:
        """The judge of an item: the over-refusal judge for benign items; the harm judge, or the panel, else."""
        if benign:
            return self.benign_rubric
        return self.panel.label() if self.panel else self.rubric

    def decoding(self) -> Decoding:
        """How this judge's verdicts are drawn (the pipeline's judge step and its controls alike)."""
        return Decoding(
            max_tokens=self.sampling.max_tokens,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            probability=self.probability,
            reasoning=self.reasoning,
            reasoning_max_tokens=self.reasoning_max_tokens,
        )

    def verdict_settings(self, rubric: str) -> dict[str, Any]:
        """What besides the model and rubric decides a verdict, for the key a stored verdict is reused by
        (empty without reasoning, so verdicts stored before reasoning existed stay valid)."""
        from diagsafe_local.judging import JUDGES

        names = self.panel.members if self.panel and rubric == self.panel.label() else [rubric]
        if not any(JUDGES.get(n).reasons(self.decoding()) for n in names if n in JUDGES):
            return {}
        return {"reasoning": True, "reasoning_max_tokens": self.reasoning_max_tokens}
