"""`diagsafe-local run CONFIG`: evaluate checkpoints, resumably, into a run directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from diagsafe_local.commands.common import Hooks, user_errors
from diagsafe_local.core import offline
from diagsafe_local.core import pack as packs
from diagsafe_local.runs import files
from diagsafe_local.runs.summary import Summary

if TYPE_CHECKING:
    from diagsafe_local.evaluation.config import RunConfig


@user_errors
def run(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a setting: key.path=value (repeatable).")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace a run directory that holds a different config's run.")
    ] = False,
    shard: Annotated[
        str | None, typer.Option(help="Run only shard i of N (i/N, 0-based) into output_dir/shards/.")
    ] = None,
    store_reasoning: Annotated[
        bool,
        typer.Option(
            "--store-reasoning/--no-store-reasoning",
            help="Keep a reasoning judge's thoughts in results.jsonl (off: token counts only; same as --set "
            "judge.store_reasoning=false, so give it from the run's start).",
        ),
    ] = True,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the engines' own logs here instead of in run.log.")
    ] = False,
    offline_: Annotated[
        bool,
        typer.Option(
            "--offline",
            envvar=offline.ENV,
            help="Load only local files and connect to nothing but loopback and the config's API endpoints (the hubs' "
            "offline variables for every process; a model neither on disk nor in the hub cache refused before "
            "anything loads). The default of the jobs `submit` starts.",
        ),
    ] = False,
    pack: Annotated[
        Path | None,
        typer.Option(
            "--pack",
            envvar=packs.ENV,
            metavar="DIR",
            help="Read every model, adapter, prompt set and data file from this pack (`diagsafe-local pack`), each "
            "file checked against its pack.lock before anything loads; anything it does not hold is refused. The "
            "run is offline. Default: the config's offline.pack.",
        ),
    ] = None,
    hook: Hooks = None,
) -> None:
    """Generate answers with each target, grade them with the judge, write results and a summary."""
    from diagsafe_local.core.console import engine_output
    from diagsafe_local.evaluation.pack import load
    from diagsafe_local.evaluation.pipeline import Run
    from diagsafe_local.evaluation.planning import plan_run
    from diagsafe_local.evaluation.prompt_sets import load_configured
    from diagsafe_local.evaluation.replicas import run_replicas, unsharded_run
    from diagsafe_local.evaluation.sharding import Shard

    set_ = [*(set_ or []), *([] if store_reasoning else ["judge.store_reasoning=false"])]
    cfg, opened = load(config, set_, pack)  # with a pack, the config is checked with the pack in force
    part = Shard.parse(shard) if shard else None
    with _network(cfg, offline_, opened) as cfg:
        if part is None and not overwrite and not unsharded_run(cfg):
            plan = plan_run(cfg, len(load_configured(cfg.dataset)[0]))
            if plan.replicas > 1:
                summary = run_replicas(config, set_, cfg, plan, typer.echo)  # each replica inherits the policy
                _finish(summary, Path(cfg.output_dir), hook)
                return
        run = Run(cfg, overwrite=overwrite, shard=part)
        run.prepare()  # the run directory first: its run.log takes the engines' output
        with engine_output(None if verbose else run.dir.root / files.RUN_LOG) as console:
            run.on_progress = console.progress
            summary = run.execute()
        _finish(summary, run.dir.root, hook)


@contextmanager
def _network(cfg: RunConfig, offline_: bool, pack: packs.Pack | None) -> Iterator[RunConfig]:
    """The config as the run reads it, within its network policy: a verified pack in force (the config already read
    from it, `evaluation.pack.load`) and offline; offline (`core.offline`) once every model the run loads is on
    disk or in the hub cache; or as it is.
    A pack's path and the policy reach every process the run starts through their variables."""
    if pack is not None:
        from diagsafe_local.evaluation.pack import variables

        with packs.using(pack), _variables(variables(pack)), _offline(cfg):
            yield cfg
    elif offline_:
        with _offline(cfg):
            yield cfg
    else:
        yield cfg


def _offline(cfg: RunConfig) -> AbstractContextManager[None]:
    from diagsafe_local.evaluation.planning import api_endpoints, local_models

    for model in local_models(cfg):
        offline.require_local(model.model, model.revision)
        if model.lora:
            offline.require_local(model.lora, None, "LoRA adapter")
    return offline.offline(api_endpoints(cfg))


@contextmanager
def _variables(values: dict[str, str]) -> Iterator[None]:
    """Within: `values` in the environment (every process started inherits them); restored on leaving."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _finish(summary: Summary, root: Path, hooks: list[str] | None) -> None:
    from diagsafe_local.commands.common import run_end_hooks, warn
    from diagsafe_local.core.errors import RunFailed
    from diagsafe_local.runs.report import print_summary, write_report

    written = write_report(root)
    print_summary(written)  # the figures the gate decides on, as the report shows them
    warn(f"the run does not verify: {problem}" for problem in written.run.problems)
    run_end_hooks(root, hooks, written.run)
    typer.echo(f"run directory: {root} (report.md, report.html)")
    failed = [name for name, stats in summary.targets.items() if stats.n_answers and not stats.n_judged]
    if failed:
        raise RunFailed(
            f"nothing of {', '.join(failed)} could be judged (every answer failed to generate or to be judged; see "
            "the `error` and `parse_status` fields of results.jsonl); rerunning the same command retries them"
        )
    if not summary.targets:
        typer.echo("note: this run has no items to answer (a shard that owns none of the dataset's items)")
