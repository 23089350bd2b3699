"""`train-classifier` from start to finish: data -> prompt split -> labels -> base scores -> LoRA training
-> adapter, loss curve -> held-out evaluation -> optional merge. Every output lands in `output_dir`:

    split.json            training and held-out prompt ids
    training_set.jsonl    the pairs trained on, each with its label, label kind and metric value
    train_log.jsonl       loss per optimizer step, held-out loss per epoch
    loss.png              both curves
    adapter/              the LoRA adapter (peft; loads in vLLM with `lora:` / --judge-lora)
    held_out_scores.csv   base P(Yes), tuned P(Yes) and the metric for every held-out pair
    evaluation.csv/.md    the comparison table
    merged/               base + adapter merged (with `merge: true`)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagsafe_local.classifier.config import TrainConfig
from diagsafe_local.classifier.evaluate import evaluation_table
from diagsafe_local.classifier.labels import (
    build_training_set,
    load_pairs,
    metric_values,
    quirk_lines,
    released,
    split_prompts,
)
from diagsafe_local.classifier.train import Encoder, attach_lora, load_base, p_yes, plot_losses, train_lora
from diagsafe_local.core import jsonl
from diagsafe_local.core.atomic import write_text as atomic_write_text
from diagsafe_local.core.hub import resolve_dataset

BASE, TUNED = "base P(Yes)", "HarmClassifier P(Yes)"


Progress = Callable[..., None]  # (stage, done, total, rate=True, note="") as core.console.Console.progress


def train_classifier(
    config: TrainConfig, echo: Callable[[str], None] = print, progress: Progress | None = None
) -> pd.DataFrame | None:
    """Train, save and evaluate; returns the evaluation table (None with `evaluate: false`). `progress` hears of
    every long step: the base model's held-out scores, each optimizer step (loss, learning rate), the tuned
    model's scores."""
    report = progress or (lambda *args, **kwargs: None)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs, dataset = load_pairs(resolve_dataset(config.data))
    for line in quirk_lines(pairs):
        echo(f"warning: {line}")
    if released(pairs):  # the authors' labels: every pair trains; evaluate with `bench --exclude-training-prompts`
        train_ids, held_ids = {p.prompt_id for p in pairs}, set[str]()
        config = config.model_copy(update={"evaluate": False})
        echo(
            "released training labels: every pair trains with its own label, nothing is held out; rank the "
            "adapter with `bench --judge harmclassifier --exclude-training-prompts FILE` (it leaves out the "
            "benchmark prompts FILE trains on: none, for the authors' file)"
        )
    else:
        train_ids, held_ids = split_prompts([p.prompt_id for p in pairs], config.held_out, config.seed)
    atomic_write_text(
        out / "split.json", json.dumps({"train": sorted(train_ids), "held_out": sorted(held_ids)}, indent=1)
    )
    train_set = build_training_set(
        [p for p in pairs if p.prompt_id in train_ids],
        config.soft_labels,
        config.examples,
        config.hard_labels,
        config.seed,
    )
    held = [p for p in pairs if p.prompt_id in held_ids]
    jsonl.write(out / "training_set.jsonl", train_set)
    n_soft = sum(e.kind == "soft" for e in train_set)
    echo(
        f"{len(train_set)} training pairs ({len(train_set) - n_soft} hard, {n_soft} soft labels) from "
        f"{len(train_ids)} prompts; {len(held)} held-out pairs from {len(held_ids)} prompts"
    )

    tokenizer, model = load_base(config)
    encoder = Encoder(tokenizer, config.training.max_length)
    held_sequences = [encoder.encode(p) for p in held]
    batch = config.training.micro_batch_size
    model.eval()
    base_scores = (
        p_yes(
            model, encoder, held_sequences, batch, lambda done, total: report("base model, held-out pairs", done, total)
        )
        if config.evaluate
        else []
    )
    model = attach_lora(model, config)

    log_path = out / "train_log.jsonl"
    log_path.write_text("")

    def log(record: dict[str, Any]) -> None:
        jsonl.append(log_path, [record])
        if record["kind"] == "step":
            note = f"epoch {record['epoch']}, loss {record['loss']:.4f}, lr {record['lr']:.2e}"
            report("training, optimizer steps", record["step"], record["steps"], note=note)
        if record["kind"] == "epoch":
            figures = ", ".join(f"{k} {v:.4f}" for k, v in record.items() if isinstance(v, float))
            echo(f"epoch {record['epoch']} done" + (f": {figures}" if figures else ""))

    started = time.perf_counter()
    held_labels = [float(p.harmful) for p in held]
    train_lora(model, encoder, config, train_set, held_sequences if config.evaluate else [], held_labels, log)
    echo(f"training took {time.perf_counter() - started:.0f} s" + _peak_memory())
    model.save_pretrained(out / "adapter")
    plot_losses(log_path, out / "loss.png")
    echo(f"adapter saved to {out / 'adapter'}; loss curve {out / 'loss.png'}")

    table = None
    if config.evaluate:
        model.eval()
        scorers = {
            BASE: np.array(base_scores),
            TUNED: np.array(
                p_yes(
                    model,
                    encoder,
                    held_sequences,
                    batch,
                    lambda done, total: report("tuned model, held-out pairs", done, total),
                )
            ),
            config.soft_labels.metric: metric_values(held, config.soft_labels.metric),
        }
        pd.DataFrame(
            {
                "prompt_id": [p.prompt_id for p in held],
                "response_id": [p.response_id for p in held],
                "category": [p.category for p in held],
                "harmful": [p.harmful for p in held],
                **scorers,
            }
        ).to_csv(out / "held_out_scores.csv", index=False)
        table = evaluation_table(held, scorers, {BASE, TUNED}, dataset, seed=config.seed)
        table.to_csv(out / "evaluation.csv", index=False)
        atomic_write_text(
            out / "evaluation.md",
            "# HarmClassifier held-out evaluation\n\n" + table.to_markdown(index=False, floatfmt=".3f") + "\n",
        )
        echo(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if config.merge:
        merged = model.merge_and_unload()
        merged.save_pretrained(out / "merged")
        tokenizer.save_pretrained(out / "merged")
        echo(f"merged model saved to {out / 'merged'}")
    return table


def _peak_memory() -> str:
    import torch

    if not torch.cuda.is_available():
        return ""
    return f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
