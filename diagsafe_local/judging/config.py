"""The judge's configuration: its engine, the judges it runs (checked against the registry), how it scores."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from diagsafe_local.core.settings import StrictModel
from diagsafe_local.engines.config import MISTRAL_TEMPLATE_ARGUMENTS, EngineConfig, SamplingConfig
from diagsafe_local.judging.base import Decoding, Judge
from diagsafe_local.judging.panel import JuryRule, PanelRule
from diagsafe_local.runs.robustness import BY_NAME, PERTURBATIONS


class MetricJudgeConfig(StrictModel):
    """A reference metric as a model-free judge: harmful where its value reaches `threshold`."""

    metric: str = Field(description="A metric of `bench --list` (built in or a plugin's).")
    threshold: float = Field(description="Harmful at or above this value (e.g. validate's best_threshold).")

    def name(self) -> str:
        from diagsafe_local.judging.metric_judge import metric_judge_name

        return metric_judge_name(self.metric, self.threshold)


def judge_name(reference: str | MetricJudgeConfig) -> str:
    """The registered name of a judge given by name, policy file path or metric: what records call it."""
    from diagsafe_local.judging import JUDGES

    return JUDGES.get(reference.name() if isinstance(reference, MetricJudgeConfig) else reference).name


class SensitivityConfig(StrictModel):
    """Judge sensitivity: a stratified sample of each target's answers judged again under paraphrases of the
    judge's prompt (its policy file's `paraphrases`), the criteria and labels kept."""

    variants: int = Field(4, ge=1, description="Paraphrases the sample is judged again under.")
    sample: int = Field(
        200, ge=1, description="Answers of harmful items per target (their last judged turn), stratified by category."
    )
    over_refusal: bool | None = Field(
        None,
        description="Also judge as many answers of benign items again under paraphrases of the over-refusal "
        "judge's prompt (its policy file's `paraphrases`). None: when that judge has them (`refusal` does).",
    )


class RobustnessConfig(StrictModel):
    """Answer perturbations: a category-stratified sample of each target's answers (drawn as judge sensitivity
    draws its sample) judged again after meaning-preserving edits of the answer (`runs.robustness.PERTURBATIONS`)."""

    perturbations: list[str] = Field(
        default_factory=lambda: [p.name for p in PERTURBATIONS],
        min_length=1,
        description="The edits, by name: " + ", ".join(f"{p.name} ({p.says})" for p in PERTURBATIONS) + ".",
    )
    sample: int = Field(
        100, ge=1, description="Answers of harmful items per target (their last judged turn), stratified by category."
    )
    over_refusal: bool = Field(
        True,
        description="Also judge as many answers of benign items again, by the over-refusal judge, after the edits "
        "declared for them (all but first_paragraph; each must keep the verdict): the gate says INCONCLUSIVE "
        "(exit 4) when one moves over-refusal across max_over_refusal.",
    )

    @field_validator("perturbations")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown perturbation {unknown[0]!r}; known: {', '.join(BY_NAME)}")
        if len(set(names)) < len(names):
            raise ValueError("a perturbation is named twice")
        return names


class CascadeConfig(StrictModel):
    """A cascade (`runs.cascade`): this judge screens every final answer to a harmful item; the answers whose
    screen score is in `band` (with `send: harmful`, every one scored from the band's low end up; an answer the
    screen could not judge always) go up to `judge`, whose verdict is the cascade's there; a random audit sample
    of the answers the screen kept is judged by `judge` too, and the disagreement's interval bounds what the
    cascade may have changed. The gate says INCONCLUSIVE (exit 4) when that could move the decision."""

    judge: JuryMember = Field(
        description="The full judge the uncertain answers go up to: a whole judge with its own model (as a jury "
        "member is given)."
    )
    band: tuple[float, float] = Field(
        (0.2, 0.8), description="Screen scores from low to high (both included, in [0, 1]) go up to `judge`."
    )
    send: Literal["band", "harmful"] = Field(
        "band", description="`band`: the band only; `harmful`: every answer scored from the band's low end up."
    )
    audit_half_width: float = Field(
        0.05,
        ge=0.001,  # a smaller one is millions of audited answers (and h*h underflows to 0)
        le=0.5,
        description="The 95% interval wanted on the disagreement: the audit judges ceil(1.96^2 x 0.25 / h^2) of the "
        "answers the screen kept per target (385 for 0.05; all of them when fewer), the size that bounds a rate "
        "anywhere in [0, 1] to +-h.",
    )
    seed: int = Field(0, description="Seed of the audit sample.")

    @model_validator(mode="after")
    def _band(self) -> CascadeConfig:
        low, high = self.band
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"band must be [low, high] with 0 <= low <= high <= 1, got {list(self.band)}")
        return self


class PanelConfig(StrictModel):
    """Several harm judges, their verdicts combined (see `judging.panel`)."""

    rule: PanelRule = Field("majority", description="majority, any or all of the decisions, or the mean score.")
    members: list[str | MetricJudgeConfig] = Field(
        min_length=2,
        description="Harm judges: names of `bench --list`, policy files, or {metric, threshold}; model judges "
        "run on the judge's engine.",
    )

    def names(self) -> list[str]:
        return [judge_name(m) for m in self.members]

    def label(self) -> str:
        """The panel's name in records: rule and members."""
        return f"panel:{self.rule}:" + "+".join(self.names())


class JudgeConfig(EngineConfig):
    """The judge model and how it grades: one spec for `run`'s YAML, `bench` and `validate` alike."""

    model: str | None = Field(  # type: ignore[assignment]
        None,
        description="Local model directory or hub id; for `openai`, the served model name. Not needed when every "
        "judge is model-free (refusal-keywords, a metric judge).",
    )
    rubric: str = Field(
        "harmjudge",
        description="Judge for harmful items: a harm judge of `bench --list`, a policy file (./acme.yaml), or "
        "METRIC>=THRESHOLD.",
    )
    metric: str | None = Field(
        None, description="A reference metric as the judge of harmful items (with `threshold`; replaces rubric)."
    )
    threshold: float | None = Field(None, description="The metric judge's cut: harmful at or above it.")
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
    jury: JuryConfig | None = Field(
        None,
        description="Judge harmful items by a jury of whole judges, each with its own model, run one after another "
        "(each loaded once); every member's verdict is kept in the record (`panel`). Costs one verdict per member "
        "per harmful answer. The health checks' control verdicts and benign items still use this judge.",
    )
    sensitivity: SensitivityConfig | None = Field(
        None,
        description="Judge a sample again under K paraphrases of the judge's prompt; the gate says INCONCLUSIVE "
        "(exit 4) when the decision changes with the wording. Costs variants x sample verdicts per target.",
    )
    robustness: RobustnessConfig | None = Field(
        None,
        description="Judge a sample again after meaning-preserving edits of the answers (a disclaimer, 'Sure, here "
        "is', markdown, padding); the gate says INCONCLUSIVE (exit 4) when an edit that must not change a verdict "
        "moves the decision. Costs up to perturbations x sample verdicts per target.",
    )
    injection_canary: bool = Field(
        False,
        description="Send the policy-injection canary: plainly harmful control answers that tell the judge its "
        "policy allows them; a judge that calls any not harmful fails it and the gate refuses the run (exit 3). "
        "For a judge whose policy is text (a policy file, gpt-oss-safeguard, the 2026 guards; `bench --list`), sampled; "
        "costs 3 verdicts per run.",
    )
    cascade: CascadeConfig | None = Field(
        None,
        description="Screen with this judge and send its uncertain band up to a full judge; a random audit of the "
        "rest is judged by both, and the gate says INCONCLUSIVE (exit 4) when the audited disagreement could move "
        "the decision. Costs the band plus the audit in full-judge verdicts per target.",
    )
    validation: str | None = Field(
        None,
        description="A `validate` output directory that measured this judge (same judge, model and scoring mode) "
        "on a harm gold set: the summary, report and `gate --corrected` then carry its FPR/FNR. `auto`: the newest "
        "validation `validate` stored for this very judge (by identity: prompt, parser, model by content, "
        "sampling; see `diagsafe-local judges`); none stored is said, and the run goes on without one.",
    )

    @field_validator("benign_rubric")
    @classmethod
    def _former_name(cls, value: str) -> str:
        return "refusal-keywords" if value == "keywords" else value

    @field_validator("kind", mode="before")
    @classmethod
    def _engine_words(cls, value: Any) -> Any:
        """The CLI's words for the two engines a judge usually runs on."""
        return {"local": "vllm", "api": "openai"}.get(value, value)

    @model_validator(mode="before")
    @classmethod
    def _metric_judge(cls, data: Any) -> Any:
        """`metric: NAME, threshold: T` is the judge `NAME>=T` (rubric)."""
        if isinstance(data, dict) and data.get("metric") is not None:
            if data.get("threshold") is None:
                raise ValueError(
                    "a metric judge needs its threshold (judge.threshold), e.g. validate's best_threshold for it"
                )
            if "rubric" in data:
                raise ValueError("give either rubric or metric (with threshold), not both")
            from diagsafe_local.judging.metric_judge import metric_judge_name

            data = {**data, "rubric": metric_judge_name(data["metric"], float(data["threshold"]))}
        elif isinstance(data, dict) and data.get("threshold") is not None:
            raise ValueError("threshold is for a metric judge: give metric too")
        return data

    @model_validator(mode="before")
    @classmethod
    def _model_free_default(cls, data: Any) -> Any:
        """A judge without a model (a metric judge, refusal-keywords) judges benign items without one too, unless
        told otherwise: the default `refusal` rubric would need the model it does not have."""
        if not isinstance(data, dict) or "benign_rubric" in data or data.get("model") is not None:
            return data
        from diagsafe_local.core.errors import DiagsafeError
        from diagsafe_local.judging import JUDGES

        try:
            model_free = (
                data.get("metric") is not None or not JUDGES.get(str(data.get("rubric", "harmjudge"))).needs_model
            )
        except DiagsafeError:
            return data  # the rubric's own check names the problem
        return {**data, "benign_rubric": "refusal-keywords"} if model_free else data

    @model_validator(mode="before")
    @classmethod
    def _judges_tokenizer_mode(cls, data: Any) -> Any:
        """On vLLM, the tokenizer mode the harm judge declares (Shieldstral: mistral), unless the config names one."""
        if not isinstance(data, dict) or data.get("tokenizer_mode") is not None:
            return data
        if cls._engine_words(data.get("kind", "vllm")) != "vllm":
            return data
        from diagsafe_local.core.errors import DiagsafeError
        from diagsafe_local.judging import JUDGES

        try:
            mode = JUDGES.get(str(data.get("rubric", "harmjudge"))).tokenizer_mode
        except DiagsafeError:
            return data  # the rubric's own check names the problem
        return data if mode is None else {**data, "tokenizer_mode": mode}

    @model_validator(mode="after")
    def _judges(self) -> JudgeConfig:
        from diagsafe_local.core.errors import DiagsafeError
        from diagsafe_local.judging import JUDGES

        try:
            harm = JUDGES.get(self.rubric)
            benign = JUDGES.get(self.benign_rubric)
            members = [("panel.members", JUDGES.get(m)) for m in (self.panel.names() if self.panel else [])]
        except DiagsafeError as exc:  # an unknown name, a bad policy file: the config's error, located by key
            raise ValueError(str(exc)) from None
        for field, judge in (("rubric", harm), ("benign_rubric", benign), *members):
            if judge.needs_model and judge.classifier != (self.kind == "classifier"):
                need = "classifier" if judge.classifier else "an LLM engine (vllm, openai or transformers)"
                hint = (
                    " (use benign_rubric: refusal-keywords with a classifier judge)" if field == "benign_rubric" else ""
                )
                raise ValueError(f"{field} '{judge.name}' needs kind {need}, not '{self.kind}'{hint}")
        model_needed = [j.name for _, j in (("rubric", harm), ("benign_rubric", benign), *members)]
        model_needed = [n for n in model_needed if JUDGES.get(n).needs_model]
        if self.model is None and model_needed:
            raise ValueError(f"judge '{model_needed[0]}' needs a model: set model")
        harm.check_probability(self.probability)
        harm.check_reasoning(self.reasoning)
        sent = self.template_arguments() if self.renders_with_mistral_common else {}
        for argument, sender in sent.items():
            if argument not in MISTRAL_TEMPLATE_ARGUMENTS:
                raise ValueError(
                    f"chat_template_kwargs: judge '{sender}' sends the template argument '{argument}', which "
                    "tokenizer_mode mistral ignores (mistral_common takes reasoning_effort only); set tokenizer_mode: hf"
                )
        if self.cascade is not None and (self.jury is not None or self.panel is not None):
            raise ValueError("cascade: the screen is this one judge; a jury or a panel belongs to no screen")
        if self.jury is not None and (self.panel is not None or self.sensitivity is not None):
            raise ValueError(
                "jury: give a jury or a panel, not both; judge sensitivity paraphrases one judge, not a jury"
            )
        if self.sensitivity is not None:
            paraphrases = len(getattr(harm, "paraphrases", ()))
            if self.panel is not None or not harm.needs_model or paraphrases < self.sensitivity.variants:
                raise ValueError(
                    f"sensitivity: {self.sensitivity.variants} variants need a model judge whose policy file has as "
                    f"many paraphrases (harmjudge has 4; a policy file of yours lists its own under `paraphrases:`); "
                    f"'{harm.name}' has {paraphrases}" + (" and a panel has none" if self.panel else "")
                )
        if (self.robustness is not None or self.injection_canary) and (
            self.jury is not None or self.panel is not None or not harm.needs_model
        ):
            raise ValueError("robustness and injection_canary re-judge with one model judge, not a panel or a jury")
        if self.injection_canary and not harm.policy_is_text:
            raise ValueError(
                "injection_canary needs a judge whose policy is text (a policy file such as harmjudge or yours, "
                f"gpt-oss-safeguard, the 2026 guards); '{harm.name}' is not"
            )
        if self.injection_canary and harm.uses_probability(self.probability):
            raise ValueError("injection_canary reads the judge's written verdict: it needs sampled verdicts")
        if self.deterministic and self.sampling.temperature > 0 and not harm.uses_probability(self.probability):
            raise ValueError("deterministic verdicts need greedy decoding: set sampling.temperature to 0")
        if self.sensitivity is not None:
            refusal = len(getattr(benign, "paraphrases", ())) if benign.needs_model else 0
            if self.sensitivity.over_refusal and refusal < self.sensitivity.variants:
                raise ValueError(
                    f"sensitivity.over_refusal: {self.sensitivity.variants} variants need an over-refusal judge with "
                    f"as many paraphrases (refusal has 4); '{benign.name}' has {refusal}"
                )
            if self.sensitivity.over_refusal is None:  # resolved, so the run's config says what it sampled
                resolved = self.sensitivity.model_copy(update={"over_refusal": refusal >= self.sensitivity.variants})
                return self.model_copy(update={"sensitivity": resolved})
        return self

    def check_roles(self) -> None:
        """In a run, the judge of harmful items measures harm and the judge of benign items measures refusal
        (`bench` and `validate` take a judge of either kind)."""
        from diagsafe_local.judging import JUDGES

        harm, benign = JUDGES.get(self.rubric), JUDGES.get(self.benign_rubric)
        if harm.measures != "harm":
            raise ValueError(f"rubric '{self.rubric}' measures {harm.measures}, not harm")
        if benign.measures != "refusal":
            raise ValueError(f"benign_rubric '{self.benign_rubric}' measures {benign.measures}, not refusal")
        for member in self.panel.names() if self.panel else []:
            if JUDGES.get(member).measures != "harm":
                raise ValueError(f"panel member '{member}' measures {JUDGES.get(member).measures}, not harm")
        for juror in self.jury.members if self.jury else []:
            if juror.harm_judge.measures != "harm":
                raise ValueError(f"jury member '{juror.label}' measures {juror.harm_judge.measures}, not harm")

    @property
    def one_process(self) -> str | None:
        """The setting whose sample is drawn from the whole dataset (None: none): the run is then one process,
        never shards."""
        return next((f"judge.{f}" for f in ("sensitivity", "robustness") if getattr(self, f) is not None), None)

    @property
    def harm_judge(self) -> Judge:
        """The judge of harmful items (for `bench` and `validate`: the judge under test)."""
        from diagsafe_local.judging import JUDGES

        return JUDGES.get(self.rubric)

    @property
    def rubric_name(self) -> str:
        """The harm judge's registered name (a policy file's `name`, not its path)."""
        return judge_name(self.rubric)

    @property
    def scoring(self) -> Literal["probability", "sampled"]:
        """How the harm judge's verdicts are scored: first-token P(positive), or sampled verdicts."""
        from diagsafe_local.judging import JUDGES

        return "probability" if JUDGES.get(self.rubric).uses_probability(self.probability) else "sampled"

    @property
    def needs_model(self) -> bool:
        """Whether any of its judges asks a model (else no engine is opened at all)."""
        from diagsafe_local.judging import JUDGES

        names = [self.rubric_name, judge_name(self.benign_rubric), *(self.panel.names() if self.panel else [])]
        return any(JUDGES.get(n).needs_model for n in names)

    @property
    def constrained(self) -> bool:
        """Whether a model decodes any of its verdicts under a schema (then every run sends the grammar canary):
        a model judge that samples its verdicts, not a classifier, not the harm judge scored by probability."""

        return self.own_constrained or any(m.own_constrained for m in (self.jury.members if self.jury else []))

    @property
    def own_constrained(self) -> bool:
        """Whether this judge's own model (not a jury member's) decodes any verdict under a schema."""
        from diagsafe_local.judging import JUDGES

        names = {self.rubric_name, judge_name(self.benign_rubric), *(self.panel.names() if self.panel else [])}
        return any(
            JUDGES.get(n).needs_model
            and not JUDGES.get(n).classifier
            and not (n == self.rubric_name and self.scoring == "probability")
            for n in names
        )

    def judge_for(self, benign: bool) -> str:
        """The judge of an item: the over-refusal judge for benign items; the harm judge, the panel or the jury,
        else."""
        if benign:
            return judge_name(self.benign_rubric)
        if self.jury is not None:
            return self.jury.label()
        return self.panel.label() if self.panel else self.rubric_name

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

    def template_arguments(self) -> dict[str, str]:
        """The chat template arguments its model judges' requests send, each with the judge that sends it: their
        `chat_template_kwargs`, with `reasoning_template_kwargs` where they reason."""
        from diagsafe_local.judging import JUDGES

        names = [self.rubric_name, judge_name(self.benign_rubric), *(self.panel.names() if self.panel else [])]
        judges = [JUDGES.get(n) for n in names]
        return {
            argument: judge.name
            for judge in judges
            if judge.needs_model and not judge.classifier
            for argument in judge.template_kwargs(judge.reasons(self.decoding())) or {}
        }

    def verdict_settings(self, rubric: str) -> dict[str, Any]:
        """What besides the model and rubric decides a verdict, for the key a stored verdict is reused by (each
        setting only where set: reasoning, a policy file, the tokenizer mode; so older stored verdicts stay valid)."""
        from diagsafe_local.judging import JUDGES

        if self.jury is not None and rubric == self.jury.label():
            return {"jury": {m.label: m.verdict_settings(m.rubric_name) for m in self.jury.members}}
        names = self.panel.names() if self.panel and rubric == self.panel.label() else [rubric]
        judges = [JUDGES.get(n) for n in names if n in JUDGES]
        settings: dict[str, Any] = {}
        if any(j.reasons(self.decoding()) for j in judges):
            settings.update(reasoning=True, reasoning_max_tokens=self.reasoning_max_tokens)
        policies = {j.name: j.fingerprint for j in judges if j.fingerprint}
        if policies:  # a user's policy file, by content: an edited policy judges again
            settings["policies"] = policies
        if self.tokenizer_mode is not None and any(j.needs_model for j in judges):
            settings["tokenizer_mode"] = self.tokenizer_mode  # mistral and hf render different token ids
        return settings


class JuryMember(JudgeConfig):
    """A whole judge of a jury: its own engine and model, rubric and decoding (no jury, panel or sensitivity of
    its own)."""

    name: str | None = Field(
        None, description="What records and the summary call it (default: its rubric and model, harmjudge@Qwen3-8B)."
    )

    @model_validator(mode="after")
    def _whole_judge(self) -> JuryMember:
        nested = [
            f
            for f in ("jury", "panel", "sensitivity", "robustness", "cascade", "validation")
            if getattr(self, f) is not None
        ]
        if nested:
            raise ValueError(f"a jury member is one judge: {', '.join(nested)} belong to the jury's judge")
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        model = (self.model or "").rstrip("/").rsplit("/", 1)[-1]
        return f"{self.rubric_name}@{model}" if model else self.rubric_name


class JuryConfig(StrictModel):
    """Several whole judges, each with its own model, over the same answers; their decisions combined by `rule`
    (see `judging.panel`: a majority tie fails closed, as harmful; a member that errs on an answer votes harmful)."""

    rule: JuryRule = Field("majority", description="majority (ties harmful), unanimous-harmful or any-harmful.")
    members: list[JuryMember] = Field(min_length=2, description="The jurors: whole judges (kind, model, rubric, ...).")

    @model_validator(mode="after")
    def _distinct(self) -> JuryConfig:
        labels = [m.label for m in self.members]
        twice = sorted({n for n in labels if labels.count(n) > 1})
        if twice:
            raise ValueError(f"jury members must have distinct names; {', '.join(twice)} is twice (set name:)")
        bad = [n for n in labels if any(c in n for c in ":+")]
        if bad:
            raise ValueError(f"jury member name '{bad[0]}' may not hold ':' or '+' (set name:)")
        return self

    def label(self) -> str:
        """The jury's name in records: rule and members."""
        return f"jury:{self.rule}:" + "+".join(m.label for m in self.members)

    def identity(self) -> dict[str, Any]:
        """The jury as one judge, for `validate`'s entry and the run that uses it (`judge.validation`): its
        members' judges and models by content."""
        from diagsafe_local.core.hashing import content_key
        from diagsafe_local.engines.identity import engine_identity

        members = [(m.label, m.rubric_name, m.scoring, engine_identity(m).key()) for m in self.members]
        return {"model": "jury", "model_hash": content_key(self.rule, members), "lora_hash": None}


JudgeConfig.model_rebuild()
CascadeConfig.model_rebuild()
