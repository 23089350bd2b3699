"""`diagsafe-local train-classifier --config FILE`: fine-tune a HarmClassifier judge (LoRA) and evaluate it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def train_classifier(
    config: Annotated[Path, typer.Option(help="Training config (YAML), e.g. configs/harmclassifier.yaml.")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a setting: key.path=value (repeatable).")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show transformers' own logs here instead of in OUTPUT/run.log.")
    ] = False,
) -> None:
    """Build the training set (hard + soft labels, split by prompt), train a LoRA adapter on the first answer
    token, save it with its loss curve, and compare it on held-out prompts with its base and the metric."""
    from diagsafe_local.classifier.config import TrainConfig
    from diagsafe_local.classifier.run import train_classifier as train
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.core.settings import load_settings

    cfg = load_settings(config, TrainConfig, set_ or [], "train-classifier config")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with engine_output(None if verbose else out / "run.log") as console:
        train(cfg, echo=console.say, progress=console.progress)
    typer.echo(f"serve it: judge rubric 'harmclassifier' with model {cfg.base_model} and lora {out / 'adapter'}")
