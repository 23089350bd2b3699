"""`diagsafe-local doctor`: is this node ready? One block of findings to paste into an issue (with --json, the
same as one JSON document), then exit 0 (ready) or 3 (what to fix)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from diagsafe_local.commands.common import user_errors

if TYPE_CHECKING:
    from diagsafe_local.selftest.doctor import Check


@user_errors
def doctor(
    engines: Annotated[
        bool, typer.Option(help="Also try vLLM itself on tiny models built here (a minute or two; off: seconds).")
    ] = True,
    work: Annotated[
        Path | None, typer.Option(help="Where to build the tiny models (default: a temporary folder, removed).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was found as one JSON document (progress on stderr).")
    ] = False,
) -> None:
    """Check this node before a first run: the install, the GPUs, vLLM's behaviour on tiny models; on a GPU,
    measure what the planner estimates. Ends with one block to paste into an issue. Exit 0 when it is ready, 3
    when something must be fixed (each FAIL line says what)."""
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.engines.gpus import cuda_available
    from diagsafe_local.selftest.doctor import (
        VLLM_CHECKS,
        classifier_checks,
        engine_checks,
        node_checks,
        not_run,
        report,
        vllm_installed,
    )

    checks = node_checks()
    cuda = next(c for c in checks if c.name == "cuda").status == "ok" and cuda_available()
    blocked = any(c.status == "fail" and c.name != "vllm" for c in checks)  # no vLLM: what needs none still runs
    vllm = next(c for c in checks if c.name == "vllm").status != "fail"
    if not engines or blocked:
        found = not_run("--no-engines" if not engines else "fix the FAIL lines above first", cuda)
    else:
        with tempfile.TemporaryDirectory(prefix="diagsafe-doctor-") as scratch:
            folder = work or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            with engine_output(folder / "engines.log") as console:  # vLLM's own logs go to the file
                say = console.stream
                print("doctor: the classifier engine on a tiny model", file=say, flush=True)
                found = classifier_checks(folder)
                if vllm:
                    found += engine_checks(folder, say=lambda line: print(line, file=say, flush=True))
                else:
                    why = "vLLM is not installed" if not vllm_installed() else "fix the FAIL lines above first"
                    found += not_run(why, cuda, VLLM_CHECKS)
        if work is None and any(c.status == "fail" for c in found):
            typer.echo(
                "vLLM's own output and each failed check's traceback: rerun with --work DIR (DIR/engines.log)",
                err=as_json,
            )
    found_all = report([*checks, harmony_check(), *found])
    if as_json:
        typer.echo(found_all.model_dump_json(indent=2))
    else:
        typer.echo(found_all.block())
        typer.echo("READY" if found_all.ready else "NOT READY: fix each FAIL line above")
    raise typer.Exit(0 if found_all.ready else 3)


def harmony_check() -> Check:
    """A note, never a FAIL: where a `vllm serve` of gpt-oss on this node would find the o200k vocabulary (its
    HarmonyParser loads it at the first request; our own engines, vLLM's offline `LLM`, never do:
    `judging.harmony_vocab`)."""
    from diagsafe_local.judging.harmony_vocab import VocabularyMissing, vocabulary
    from diagsafe_local.selftest.doctor import Check

    try:
        return Check(
            name="harmony vocabulary", status="ok", detail=f"for a `vllm serve` of gpt-oss: {vocabulary().detail}"
        )
    except VocabularyMissing as exc:
        return Check(name="harmony vocabulary", status="warn", detail=f"for a `vllm serve` of gpt-oss: {exc}")
