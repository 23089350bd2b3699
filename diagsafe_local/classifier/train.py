"""Train a HarmClassifier LoRA adapter (peft + transformers) with the loss on the first answer token only:
`-[y log p(Yes) + (1 - y) log p(No)]`, where the prompt is the `harmclassifier` judge's, rendered by the
base model's chat template: exactly what the judge sends when it is served.

Sequences are left-padded so the first answer token's logits are the last position's for every row,
and the model computes only those (`logits_to_keep=1`): the vocabulary projection of a 7B model over
4,096 positions would otherwise dominate memory.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagsafe_local.classifier.config import TrainConfig
from diagsafe_local.classifier.labels import LabelledPair, TrainingExample
from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.core.figures import png_figure
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import label_token_ids
from diagsafe_local.judging import JUDGES, JudgeInput

TAIL_TOKENS = 16  # kept from the end of an over-long prompt: the answer's end and the generation prompt


def classifier_prompt(pair: LabelledPair) -> tuple[Message, ...]:
    """The `harmclassifier` judge's messages for a pair (the same function serves and trains)."""
    judge = JUDGES.get("harmclassifier")
    return judge.render(JudgeInput(conversation=(Message(role="user", content=pair.prompt),), answer=pair.response))  # type: ignore[return-value]


@dataclass
class Encoder:
    """Chat-template token ids of pairs, cut to `max_length`, and the Yes/No first-token ids."""

    tokenizer: Any
    max_length: int

    def __post_init__(self) -> None:
        ids = label_token_ids(self.tokenizer, ("Yes", "No"))
        self.yes, self.no = ids["Yes"], ids["No"]

    def encode(self, pair: LabelledPair) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [m.model_dump() for m in classifier_prompt(pair)], tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) > self.max_length:
            ids = ids[: self.max_length - TAIL_TOKENS] + ids[-TAIL_TOKENS:]
        return ids


def resolve_dtype(name: str, torch: Any) -> Any:
    """The torch dtype for `name`; auto = bfloat16 (or float16) on GPU, float32 on CPU."""
    if name != "auto":
        return getattr(torch, name)
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_base(config: TrainConfig) -> tuple[Any, Any]:
    """The tokenizer and base model, on GPU when there is one, optionally 8/4-bit quantised."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MissingDependencyError("transformers", "train", "train-classifier") from None
    settings = config.training
    dtype = resolve_dtype(settings.dtype, torch)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if settings.quantization != "none":
        try:
            import bitsandbytes  # noqa: F401
            from transformers import BitsAndBytesConfig
        except ImportError:
            raise DiagsafeError(
                "training.quantization needs bitsandbytes (pip install bitsandbytes) and a GPU"
            ) from None
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_8bit=True)
            if settings.quantization == "8bit"
            else BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_type="nf4")
        )
        kwargs["device_map"] = {"": 0}
    tokenizer = AutoTokenizer.from_pretrained(config.base_model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(config.base_model, **kwargs)
    if settings.quantization == "none" and torch.cuda.is_available():
        model.to("cuda")  # type: ignore[arg-type]
    return tokenizer, model


def attach_lora(model: Any, config: TrainConfig) -> Any:
    """Wrap the base in a fresh LoRA adapter (gradient checkpointing and k-bit preparation on request)."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    settings = config.training
    if settings.quantization != "none":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=settings.gradient_checkpointing)
    elif settings.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=config.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def first_token_logprobs(model: Any, sequences: Sequence[list[int]], encoder: Encoder) -> tuple[Any, Any]:
    """log p(Yes), log p(No) at the first answer token of each (left-padded) sequence."""
    import torch

    device = next(model.parameters()).device
    width = max(len(s) for s in sequences)
    pad = encoder.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits[:, -1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return torch.logsumexp(logprobs[:, encoder.yes], -1), torch.logsumexp(logprobs[:, encoder.no], -1)


def soft_label_loss(lp_yes: Any, lp_no: Any, labels: Any) -> Any:
    """Mean of -[y log p(Yes) + (1 - y) log p(No)]."""
    return -(labels * lp_yes + (1 - labels) * lp_no).mean()


def p_yes(
    model: Any,
    encoder: Encoder,
    sequences: Sequence[list[int]],
    batch: int,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[float]:
    """P(Yes) normalised over Yes and No, as the judge scores (no gradients); `on_batch(done, total)` after each
    batch (and at 0)."""
    import torch

    out: list[float] = []
    if on_batch:
        on_batch(0, len(sequences))
    with torch.no_grad():
        for start in range(0, len(sequences), batch):
            lp_yes, lp_no = first_token_logprobs(model, sequences[start : start + batch], encoder)
            out.extend(torch.sigmoid(lp_yes - lp_no).tolist())
            if on_batch:
                on_batch(len(out), len(sequences))
    return out


def held_out_loss(
    model: Any, encoder: Encoder, sequences: Sequence[list[int]], labels: Sequence[float], batch: int
) -> float:
    import torch

    total = 0.0
    with torch.no_grad():
        for start in range(0, len(sequences), batch):
            lp_yes, lp_no = first_token_logprobs(model, sequences[start : start + batch], encoder)
            y = torch.tensor(labels[start : start + batch], device=lp_yes.device)
            total += float(soft_label_loss(lp_yes, lp_no, y)) * len(y)
    return total / max(1, len(sequences))


def train_lora(
    model: Any,
    encoder: Encoder,
    config: TrainConfig,
    train: Sequence[TrainingExample],
    held_sequences: Sequence[list[int]],
    held_labels: Sequence[float],
    log: Callable[[dict[str, Any]], None],
) -> None:
    """Optimise the adapter; `log` receives one record per optimizer step and one per epoch (with the
    held-out loss when held-out sequences are given)."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    settings = config.training
    torch.manual_seed(config.seed)
    sequences = [encoder.encode(e.pair) for e in train]
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total_steps = steps_per_epoch * settings.epochs
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate)
    schedule = get_linear_schedule_with_warmup(optimizer, round(settings.warmup_ratio * total_steps), total_steps)
    order = list(range(len(train)))
    rng = random.Random(config.seed)
    step = 0
    for epoch in range(1, settings.epochs + 1):
        model.train()
        rng.shuffle(order)
        for start in range(0, len(order), settings.batch_size):
            chunk = order[start : start + settings.batch_size]
            losses = []
            for micro in range(0, len(chunk), settings.micro_batch_size):
                ids = chunk[micro : micro + settings.micro_batch_size]
                lp_yes, lp_no = first_token_logprobs(model, [sequences[k] for k in ids], encoder)
                y = torch.tensor([train[k].label for k in ids], device=lp_yes.device)
                loss = soft_label_loss(lp_yes, lp_no, y)
                (loss * len(ids) / len(chunk)).backward()
                losses.append(loss.item() * len(ids))
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            log(
                {
                    "kind": "step",
                    "step": step,
                    "steps": total_steps,
                    "epoch": epoch,
                    "loss": sum(losses) / len(chunk),
                    "lr": schedule.get_last_lr()[0],
                }
            )
        model.eval()
        record: dict[str, Any] = {"kind": "epoch", "epoch": epoch, "step": step}
        if held_sequences:
            record["held_out_loss"] = held_out_loss(
                model, encoder, held_sequences, held_labels, settings.micro_batch_size
            )
        log(record)


def plot_losses(log_path: Path, out: Path) -> None:
    """Training loss per step and held-out loss per epoch, in one PNG."""
    records = [row for _, row in jsonl.json_rows(log_path)]
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch" and "held_out_loss" in r]
    with png_figure(out, (7, 4)) as ax:
        ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], label="training loss (per step)")
        if epochs:
            ax.plot(
                [r["step"] for r in epochs],
                [r["held_out_loss"] for r in epochs],
                "o-",
                label="held-out loss vs human labels (per epoch)",
            )
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("first-token soft-label cross-entropy")
        ax.set_title("HarmClassifier training")
        ax.legend()
