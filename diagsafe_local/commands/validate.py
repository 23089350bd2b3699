"""`diagsafe-local validate`: measure judges, metrics and stored verdicts against human labels."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from diagsafe_local.commands.common import JudgeModels, Samples, judge_options, judge_spec, user_errors


def _names(values: list[str] | None) -> list[str]:
    """Repeatable options that also take comma-separated lists."""
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


@user_errors
@judge_options
def validate(
    gold: Annotated[str, typer.Option(help="Gold set: a file (CSV, parquet, JSONL) or a Hugging Face dataset id.")],
    format_: Annotated[
        str, typer.Option("--format", help="jbb (JailbreakBench judge comparison), xstest, harmmetric, jsonl or csv.")
    ],
    judge: Annotated[
        list[str] | None,
        typer.Option(
            help="A judge to validate (repeatable): a name of `bench --list`, a policy file, or METRIC>=THRESHOLD."
        ),
    ] = None,
    judge_model: JudgeModels = None,
    metric: Annotated[
        list[str] | None, typer.Option(help="A registered metric, swept over thresholds (repeatable).")
    ] = None,
    stored: Annotated[
        list[str] | None, typer.Option(help="Verdict columns already in the file (default: jbb's four judges).")
    ] = None,
    panel: Annotated[
        str | None, typer.Option(help="Also score a panel of the judges: majority, any, all or mean.")
    ] = None,
    jury: Annotated[
        Path | None,
        typer.Option(
            help="A run config whose judge.jury to measure: each member as a judge, and the jury as one judge "
            "(what its judge.validation then names)."
        ),
    ] = None,
    classes: Annotated[int, typer.Option(help="2 (binary) or 3 (XSTest's three refusal classes too).")] = 2,
    task: Annotated[
        str | None, typer.Option(help="jsonl/csv: what label 1 means, 'harm' (default) or 'refusal'.")
    ] = None,
    prompt_column: Annotated[str | None, typer.Option(help="Column the judge sees as the request.")] = None,
    response_column: Annotated[str, typer.Option(help="jsonl/csv: the judged answer's column.")] = "response",
    label_column: Annotated[
        list[str] | None, typer.Option(help="jsonl/csv: label column(s); several are annotators, majority wins.")
    ] = None,
    id_column: Annotated[str | None, typer.Option(help="jsonl/csv: item id column (default: the line number).")] = None,
    group_column: Annotated[list[str] | None, typer.Option(help="jsonl/csv: break errors down by this column.")] = None,
    encoding: Annotated[str, typer.Option(help="CSV text encoding (e.g. mac_roman for some JBB copies).")] = "utf-8",
    samples: Samples = 1,
    target_fpr: Annotated[
        float | None,
        typer.Option(
            help="Also report, for score-valued rows, the cut whose FPR stays within this rate.", min=0, max=1
        ),
    ] = None,
    bootstrap: Annotated[
        int, typer.Option(help="Bootstrap resamples for the composite figures' 95% CIs.", min=100)
    ] = 1000,
    seed: Annotated[int, typer.Option(help="Bootstrap and sampling seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/validate"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show the judge engine's logs here.")] = False,
    judge_settings: dict[str, Any] | None = None,
) -> None:
    """Score judges against human labels: agreement.csv (accuracy, kappa, FPR, FNR, AUROC ... with 95% CIs),
    confusion matrices, per-group errors, disagreements, ROC and calibration; validation.json for the gate."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.validation.gold import Columns, load_gold
    from diagsafe_local.validation.validate import run_validate

    jurors = None
    if jury is not None:
        from diagsafe_local.evaluation.config import load_config

        jurors = load_config(jury).judge.jury
        if jurors is None:
            raise DiagsafeError(f"--jury {jury}: its judge has no jury (judge.jury)")
    judges, models = _names(judge), list(judge_model or [])
    needs_model = [name for name in judges if JUDGES.get(name).needs_model]
    if needs_model and not models:
        raise DiagsafeError(f"--judge {needs_model[0]} needs --judge-model")
    if len(models) > 1 and len(models) != len(needs_model):
        raise DiagsafeError(
            f"{len(models)} --judge-model for {len(needs_model)} judges that need one: give one, or one each"
        )
    if task not in (None, "harm", "refusal"):
        raise DiagsafeError(f"--task must be harm or refusal, got '{task}'")
    settings = dict(judge_settings or {})
    if samples > 1 and "temperature" not in settings.get("sampling", {}):
        settings["sampling"] = {**settings.get("sampling", {}), "temperature": 0.7}  # sampled verdicts vary
    paired = iter(models if len(models) > 1 else models * len(needs_model))
    specs = [judge_spec(name, next(paired) if name in needs_model else None, settings) for name in judges]
    columns = Columns(
        prompt=prompt_column,
        response=response_column,
        labels=tuple(_names(label_column)) or ("label",),
        id=id_column,
        groups=tuple(_names(group_column)),
        stored=tuple(_names(stored)),
    )
    data = load_gold(gold, format_, columns, task, encoding)  # type: ignore[arg-type]
    from diagsafe_local.commands.common import warn

    warn(data.notes)
    rows = run_validate(
        data,
        out,
        specs,
        _names(metric),
        _names(stored),
        panel,
        classes,
        bootstrap,
        seed,
        verbose,
        target_fpr=target_fpr,
        samples=samples,
        jury=jurors,
    )
    from rich.table import Table

    from diagsafe_local.core.console import rich_console

    table = Table(title=f"agreement with {gold} ({len(data.labelled)} labelled items)")
    for column in ("judge", "n", "missing", "accuracy", "kappa", "FPR", "FNR", "AUROC"):
        table.add_column(column)
    for row in rows:
        cells = [row[m] for m in ("accuracy", "cohen_kappa", "fpr", "fnr", "auroc")]
        table.add_row(
            row["judge"], str(row["n"]), str(row["n_missing"]), *("–" if c != c else f"{c:.3f}" for c in cells)
        )
    rich_console().print(table)  # judge names as written, never markup
    from diagsafe_local.runs.validation import read_validation

    for judged in read_validation(out).judges:  # a run's gate does not decide --corrected on such rates
        if judged.incomplete:
            typer.echo(f"NOTE  {judged.incomplete}; `gate --corrected` on a run corrected by it is INCONCLUSIVE")
    typer.echo(
        f"wrote {out}/agreement.csv, agreement.md, disagreements.jsonl, roc.png, calibration.png, validation.json"
    )
