"""The train-classifier config: where the data is, how labels are made, the LoRA and training settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from diagsafe_local.core.settings import StrictModel


class SoftLabelConfig(StrictModel):
    """Soft label = clip(sigmoid(scale * (metric - center)), band of the pair's human class).

    The bands follow HarmMetric Eval's HarmClassifier (about 0.007-0.03 for No, 0.8-0.97 for Yes): the
    metric moves a label within its class's band, never across the classes.
    """

    metric: str = Field("rouge1_recall", description="Reference metric that grades each pair (see bench --list).")
    scale: float = Field(10.0, gt=0, description="Sigmoid slope.")
    center: float = Field(0.3, description="Metric value mapped to 0.5 before clipping.")
    yes_band: tuple[float, float] = Field((0.8, 0.97), description="Clip range for harmful pairs.")
    no_band: tuple[float, float] = Field((0.007, 0.03), description="Clip range for not-harmful pairs.")

    @model_validator(mode="after")
    def _bands(self) -> SoftLabelConfig:
        for name, (low, high) in (("yes_band", self.yes_band), ("no_band", self.no_band)):
            if not 0.0 <= low <= high <= 1.0:
                raise ValueError(f"{name} must satisfy 0 <= low <= high <= 1")
        return self


class LoraSettings(StrictModel):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="All attention and MLP projections (Qwen/Llama names).",
    )


class TrainingSettings(StrictModel):
    learning_rate: float = Field(2e-4, gt=0)
    epochs: int = Field(5, ge=1)
    batch_size: int = Field(8, ge=1, description="Effective batch (micro_batch_size x gradient accumulation).")
    micro_batch_size: int = Field(1, ge=1, description="Sequences per forward pass.")
    warmup_ratio: float = Field(0.03, ge=0.0, lt=1.0)
    max_length: int = Field(4096, ge=32, description="Longest prompt in tokens; longer answers are cut in the middle.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on GPUs that support it, else float16 on GPU, float32 on CPU."
    )
    gradient_checkpointing: bool = Field(True, description="Trade compute for memory (GPU).")
    quantization: Literal["none", "8bit", "4bit"] = Field(
        "none", description="Load the base in 8/4 bits (needs bitsandbytes)."
    )

    @model_validator(mode="after")
    def _divides(self) -> TrainingSettings:
        if self.batch_size % self.micro_batch_size:
            raise ValueError("batch_size must be a multiple of micro_batch_size")
        return self


class TrainConfig(StrictModel):
    """Everything `diagsafe-local train-classifier` needs."""

    base_model: str = Field(..., description="Base chat model: local directory or hub id.")
    data: str = Field(
        ...,
        description="HarmMetric-layout file or hub id, or a labelled JSONL "
        "(prompt, response, label 0/1, optional references, prompt_id).",
    )
    output_dir: str = Field("out/harmclassifier", description="Adapter, logs, loss curve and evaluation go here.")
    examples: int | None = Field(
        300,
        ge=2,
        description="Training pairs drawn from the training prompts, half of each class where possible; null = all.",
    )
    hard_labels: int = Field(
        100, ge=0, description="How many of them keep their human 0/1 label; the rest get soft labels."
    )
    held_out: float = Field(0.2, gt=0.0, lt=1.0, description="Share of prompts held out for evaluation.")
    seed: int = 0
    soft_labels: SoftLabelConfig = Field(default_factory=SoftLabelConfig)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    merge: bool = Field(False, description="Also save the base with the adapter merged in (output_dir/merged).")
    evaluate: bool = Field(
        True, description="Score the held-out prompts with the base, the tuned model and the metric."
    )
