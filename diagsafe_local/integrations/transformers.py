"""`SafetyEvalCallback`: a `transformers.Trainer` callback that records each checkpoint in a series directory as
the Trainer saves it and submits its evaluation to SLURM. Nothing is judged inside the training process, and
`on_save` returns in milliseconds (one small file write and, with `submit`, one `sbatch`):

    from diagsafe_local.integrations.transformers import SafetyEvalCallback

    trainer = Trainer(..., callbacks=[SafetyEvalCallback("configs/checkpoint.yaml", "out/safety-series")])

With `submit=False` the checkpoints are only recorded, for a `diagsafe-local watch ... --local` elsewhere (or a
later `--submit`) to evaluate. `on_save` runs after the Trainer has written the whole checkpoint, so every one it
records is complete; only the main process records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from diagsafe_local.evaluation.slurm import Resources
from diagsafe_local.evaluation.watch import Checkpoint, SeriesSpec, record, submit


class SafetyEvalCallback(TrainerCallback):
    """Record (and with `submit`, submit the evaluation of) every checkpoint the Trainer saves."""

    def __init__(
        self,
        config: str | Path,
        series_dir: str | Path,
        submit: bool = True,
        *,
        overrides: Sequence[str] = (),
        every: int | None = None,
        baseline: str | Path | None = None,
        resources: Resources | None = None,
    ) -> None:
        self.config, self.series_dir = Path(config), Path(series_dir)
        self.submit, self.overrides, self.every = submit, list(overrides), every
        self.baseline = Path(baseline) if baseline else None
        self.resources = resources or Resources()
        self.spec: SeriesSpec | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """The series is set up (its config checked) before the first step, so a mistake stops training at once."""
        if state.is_world_process_zero:
            self.spec = SeriesSpec(
                self.series_dir, Path(args.output_dir or "."), self.config, self.overrides, self.every, self.baseline
            )

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self.spec is None:
            self.on_train_begin(args, state, control)
        assert self.spec is not None
        path = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"
        added = record(self.spec, [Checkpoint(path.name, state.global_step, path.resolve())])
        todo = [entry for entry in added if entry.status == "seen"]
        if self.submit and todo:
            submit(self.spec, todo, self.resources)
