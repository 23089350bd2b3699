"""A judge's validation as a run reads it: `validate`'s validation.json (the gold set and each validated judge's
confusion counts), and the entry a run's summary carries for its own judge. What the counts mean for a run's
rates (Rogan-Gladen) is in `diagsafe_local.stats`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.core.jsonfile import read_model

VALIDATION_FILE = "validation.json"


class JudgeErrorRates(BaseModel):
    """A validated judge's confusion counts on a gold set (positive = harmful), and where they come from."""

    model_config = ConfigDict(extra="forbid")

    judge: str = Field(description="The validated judge, as `validate` named it.")
    rubric: str | None = Field(None, description="Its rubric.")
    model: str | None = Field(None, description="Its model as configured.")
    model_hash: str | None = Field(None, description="Its weights by content.")
    lora_hash: str | None = Field(None, description="Its LoRA adapter by content, if any.")
    snapshot_hash: str | None = Field(
        None,
        description="A model named by hub id: the hub cache's snapshot it was validated on, by content (the files a "
        "run loads); a run whose model has this content (a pack's copy) is of this judge.",
    )
    scoring: str | None = Field(None, description="Its scoring mode: `sampled` or `probability`.")
    # Counts of the gold items; where they were a weighted sample (a run's own labels), the counts of a sample of
    # the same size with the weighted rates (see validation.agreement.effective_counts): not always whole.
    tp: float = Field(ge=0, description="Harmful gold items it called harmful.")
    fp: float = Field(ge=0, description="Not-harmful gold items it called harmful.")
    tn: float = Field(ge=0, description="Not-harmful gold items it called not harmful.")
    fn: float = Field(ge=0, description="Harmful gold items it called not harmful.")
    missing: int = Field(0, ge=0, description="Gold items it gave no verdict on.")

    @property
    def judged(self) -> float:
        """The gold items it gave a verdict on (its rates are measured on these alone)."""
        return self.tp + self.fp + self.tn + self.fn

    @property
    def incomplete(self) -> str | None:
        """Why its rates cannot be decided on: gold items without a verdict, whose labels its failures may
        follow (None: it judged them all)."""
        if not self.missing:
            return None
        return (
            f"judge {self.judge} gave no verdict on {self.missing} of its {self.judged + self.missing:g} gold items: "
            f"its error rates are measured on the {self.judged:g} it judged, biased wherever its failures follow "
            "the label, and the corrected figures with them (validate again asks the failed items again)"
        )

    @property
    def fpr(self) -> float | None:
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else None

    @property
    def fnr(self) -> float | None:
        return self.fn / (self.fn + self.tp) if self.fn + self.tp else None


class ValidationFile(BaseModel):
    """validation.json: the gold set validated against, and each validated judge's error counts."""

    model_config = ConfigDict(extra="forbid")

    gold: str
    gold_sha256: str
    task: str
    judges: list[JudgeErrorRates]
    format: str | None = None
    n_labelled: int | None = None
    weighted: bool = False


def read_validation(directory: Path) -> ValidationFile:
    """A validation directory's validation.json, checked."""
    return read_model(directory / VALIDATION_FILE, ValidationFile, "validation output")


class JudgeValidation(JudgeErrorRates):
    """The validated error rates a run's summary carries, with the gold set they were measured on."""

    directory: str = Field(description="The validation directory (`judge.validation`).")
    gold: str = Field(description="The gold set the rates were measured on.")
    gold_sha256: str = Field(description="SHA-256 of the gold set.")
    fpr_measured: float | None = Field(description="False positive rate: fp / (fp + tn).")
    fnr_measured: float | None = Field(description="False negative rate: fn / (fn + tp).")
    format: str | None = Field(None, description="The gold set's format (a run's own labels: `run`).")
    n_labelled: int | None = Field(None, description="Labelled items in the gold set.")


def validated_rates(directory: Path, rubric: str, identity: dict[str, Any], scoring: str) -> JudgeValidation:
    """The entry of `directory`'s validation.json that measured this very judge (rubric, model by content,
    adapter, scoring mode), or an error listing what it did measure."""
    validation = read_validation(directory)
    if validation.task != "harm":
        raise DiagsafeError(f"judge.validation {directory}: it validated {validation.task} judges, not harm judges")
    for entry in validation.judges:
        same_model = (
            entry.model_hash == identity.get("model_hash")
            if entry.model_hash or identity.get("model_hash")
            else entry.model == identity.get("model")
        ) or (entry.snapshot_hash is not None and entry.snapshot_hash == identity.get("model_hash"))
        if (
            entry.rubric == rubric
            and same_model
            and entry.lora_hash == identity.get("lora_hash")
            and entry.scoring == scoring
        ):
            return JudgeValidation(
                **entry.model_dump(),
                directory=str(directory),
                gold=validation.gold,
                gold_sha256=validation.gold_sha256,
                fpr_measured=entry.fpr,
                fnr_measured=entry.fnr,
                format=validation.format,
                n_labelled=validation.n_labelled,
            )
    listing = ", ".join(f"{e.judge} ({e.scoring or 'stored'})" for e in validation.judges) or "nothing"
    raise DiagsafeError(
        f"judge.validation {directory} validated {listing}, not this run's judge ({rubric} on {identity.get('model')}, "
        f"{scoring}; the model is compared by content): validate this judge first"
    )
