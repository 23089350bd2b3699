"""The `diagsafe-local` command line."""

from __future__ import annotations

import typer

from diagsafe_local.commands import (
    bench,
    data,
    demo,
    gate,
    models,
    plan,
    report,
    review,
    run,
    runs,
    selftest,
    submit,
    train_classifier,
    validate,
)

app = typer.Typer(
    name="diagsafe-local",
    help="Measure how harmful an LLM's answers are, offline; benchmark harmfulness metrics and judges.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.command("bench")(bench.bench)
app.command("validate")(validate.validate)
app.command("run")(run.run)
app.command("report")(report.report)
app.command("gate")(gate.gate)
app.command("merge")(runs.merge)
app.command("compare")(runs.compare)
app.command("plan")(plan.plan)
app.command("submit")(submit.submit)
app.command("train-classifier")(train_classifier.train_classifier)
app.command("selftest")(selftest.selftest)
app.add_typer(data.app, name="data")
app.add_typer(models.app, name="models")
app.command("view")(review.view)
app.command("label")(review.label)
app.command("export")(review.export)
app.command("demo")(demo.demo)

if __name__ == "__main__":
    app()
