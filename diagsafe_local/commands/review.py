"""`diagsafe-local view`, `label` and `export`: read every answer, label a sample of them, open a run in Inspect."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors

Port = Annotated[int, typer.Option(help="Port on 127.0.0.1 (default: a free one).", min=0, max=65535)]
NoBrowser = Annotated[bool, typer.Option("--no-browser", help="Print the URL only; open no browser.")]


def _serve(review: object, port: int, no_browser: bool, what: str) -> None:
    """Serve until Ctrl-C (or SIGTERM): a stop is the normal end, exit 0."""
    import time
    import webbrowser

    from diagsafe_local.core.errors import Interrupted
    from diagsafe_local.review.server import ReviewServer

    server = ReviewServer(review, port).start()  # type: ignore[arg-type]
    typer.echo(f"{what}: {server.url}")
    typer.echo("(the token in this URL is the only way in; Ctrl-C stops the server)")
    if not no_browser:
        webbrowser.open(server.launcher().as_uri())  # never the URL itself: see ReviewServer.launcher
    try:
        while True:
            time.sleep(3600)
    except Interrupted:
        typer.echo("stopped")
    finally:
        server.stop()


@user_errors
def view(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories (two or more: the same items side by side).")],
    port: Port = 0,
    no_browser: NoBrowser = False,
) -> None:
    """Browse every judged answer on a local page: filter (target, category, source, attack method, verdict,
    score, parse status, cut-off, reasoning, panel disagreement, flips, text), sort, open the whole
    conversation, verdict and reasoning; two runs (or a sweep) side by side with the flips marked."""
    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.server import Review

    _serve(Review(RunIndex(run_dirs)), port, no_browser, "viewer")


@user_errors
def label(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory.")],
    annotator: Annotated[str, typer.Option(help="Your name: your labels go to RUN_DIR/labels/NAME.jsonl.")],
    n: Annotated[
        int, typer.Option(help="Answers in the sample (drawn once; every annotator gets the same).", min=1)
    ] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the sample (or of --next's order).")] = 0,
    next_: Annotated[
        bool,
        typer.Option(
            "--next",
            help="Every answer, in the order in which a label narrows the corrected ASR's interval around "
            "--max-asr most (the likeliest-wrong verdicts first: jury splits, P(harmful) near 0.5, the judge's "
            "validated error rates), saying after each label whether the decision is settled; --n is not used.",
        ),
    ] = False,
    max_asr: Annotated[
        float | None, typer.Option(help="With --next: the gate's ASR limit the labels are to settle.", min=0, max=1)
    ] = None,
    port: Port = 0,
    no_browser: NoBrowser = False,
) -> None:
    """Label a stratified sample of the run's answers (or, with --next, the answers where a label moves the
    gate), one at a time, by keyboard (h harmful, n not harmful, u unsure, arrows to move); the judge's verdict
    shows only after your label. Each label is saved the moment it is given; restarting resumes. Then: validate
    --gold RUN_DIR --format run."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.review.index import RunIndex
    from diagsafe_local.review.labels import LabelStore, check_annotator, sample_for
    from diagsafe_local.review.server import LabelSession, Review
    from diagsafe_local.runs.baseline import verified

    check_annotator(annotator)
    if next_ != (max_asr is not None):
        raise DiagsafeError("--next and --max-asr go together: the order is towards settling that limit")
    run = verified(run_dir, "the run")  # an unfinished or changed run: its answers may still move
    records = (line.record for line in run.results())
    store = LabelStore(run_dir, annotator, run.manifest.run_id)
    index = RunIndex([run_dir])
    if max_asr is not None:
        from diagsafe_local.review.next_label import as_sample, order_for, standing

        order = order_for(run_dir, records, run.manifest.run_id, run.summary.judge_validation, seed)
        session = LabelSession(
            index, as_sample(order), store, lambda labels: standing(order, labels, max_asr), typer.echo
        )
        typer.echo(f"{len(order.entries)} answers in the order of what a label tells; {session.line()}")
    else:
        sample = sample_for(run_dir, records, run.manifest.run_id, n, seed)
        session = LabelSession(index, sample, store)
        done = sum(session.store.current(e) is not None for e in sample.entries)
        typer.echo(f"{len(sample.entries)} answers to label ({done} done) in {len(sample.strata)} strata")
    _serve(Review(index, session), port, no_browser, "labelling")


@user_errors
def export(
    run_dir: Annotated[Path, typer.Argument(help="A finished run directory.")],
    out: Annotated[Path, typer.Option(help="The log file to write (.eval or .json).")],
    format_: Annotated[str, typer.Option("--format", help="inspect: an Inspect AI eval log.")] = "inspect",
    target: Annotated[list[str] | None, typer.Option(help="Only these targets (repeatable).")] = None,
) -> None:
    """Write the run in another tool's format: `inspect` (an Inspect AI eval log, opened by `inspect view`)."""
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.review.inspect_export import export_inspect
    from diagsafe_local.runs.baseline import verified

    if format_ != "inspect":
        raise DiagsafeError(f"--format must be inspect, got '{format_}'")
    path = export_inspect(verified(run_dir, "the run"), out, target)
    typer.echo(f"wrote {path} (inspect view --log-dir {path.parent})")
