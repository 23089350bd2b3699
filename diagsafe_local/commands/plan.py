"""`diagsafe-local plan CONFIG`: how `run` would use a node's GPUs, and what to ask SLURM for."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def plan(
    config: Annotated[Path | None, typer.Argument(help="Run config (YAML).")] = None,
    gpus: Annotated[
        int | None, typer.Option(help="Plan for a node with this many GPUs (default: the GPUs visible here).", min=1)
    ] = None,
    gpu_memory: Annotated[float, typer.Option(help="GiB of memory per GPU, with --gpus.", min=1)] = 80.0,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Config override (repeatable).")] = None,
    baseline_asr: Annotated[
        float | None,
        typer.Option(help="Size a comparison with production: the baseline's ASR (with --margin).", min=0, max=1),
    ] = None,
    margin: Annotated[
        float | None, typer.Option(help="The non-inferiority margin (an ASR increase, e.g. 0.05).", min=0.001, max=1)
    ] = None,
    discordance: Annotated[
        float | None,
        typer.Option(
            help="Share of items whose verdict differs between the checkpoints, if known (else 2p(1-p)).", min=0, max=1
        ),
    ] = None,
    items: Annotated[
        int | None, typer.Option(help="With --margin: the items you have (else the config's).", min=1)
    ] = None,
) -> None:
    """Print each model's tensor parallel size, the number of pipeline replicas, and the sbatch request; with
    --baseline-asr and --margin, how many items a paired comparison with production needs."""
    if baseline_asr is not None or margin is not None:
        _plan_comparison(config, set_ or [], baseline_asr, margin, discordance, items)
        return
    if config is None:
        from diagsafe_local.core.errors import DiagsafeError

        raise DiagsafeError("give a run config (or --baseline-asr and --margin to size a comparison)")
    from diagsafe_local.engines.gpu_plan import GIB
    from diagsafe_local.evaluation.config import load_config
    from diagsafe_local.evaluation.planning import REQUESTS_PER_CLIENT, api_only, api_requests, pass_costs, plan_run

    cfg = load_config(config, set_ or [])
    memory = [int(gpu_memory * GIB)] * gpus if gpus else None
    chosen = plan_run(cfg, None, memory)
    if api_only(cfg):
        from diagsafe_local.evaluation.prompt_sets import load_configured

        n_items = len(load_configured(cfg.dataset)[0])
        processes = plan_run(cfg, n_items, memory).replicas
        typer.echo(
            f"every model is behind an API: {processes} client process(es) for about {api_requests(cfg, n_items)} "
            f"requests (one per {REQUESTS_PER_CLIENT:,}, at most one per CPU), each with its share of every "
            "endpoint's concurrency"
        )
    for line in pass_costs(cfg):
        typer.echo(line)
    if not chosen.gpus:
        typer.echo("no GPUs visible: one process on the CPU (plan for a GPU node with --gpus N --gpu-memory GIB)")
        return
    typer.echo(f"{chosen.gpus} GPUs of {chosen.gpu_memory_bytes / GIB:.0f} GiB, placement {cfg.placement.mode}")
    for engine in chosen.engines:
        size = f"{engine.weight_bytes / GIB:.1f} GiB" if engine.weight_bytes else "size unknown"
        typer.echo(
            f"  {engine.role}: {engine.model} ({size}; {engine.memory_share:.0%} of each GPU) -> "
            f"tensor_parallel_size {engine.tensor_parallel_size}"
            + (
                f" x pipeline_parallel_size {engine.pipeline_parallel_size}"
                if engine.pipeline_parallel_size > 1
                else ""
            )
        )
    typer.echo(
        f"replicas: {chosen.replicas} x {chosen.gpus_per_replica} GPU(s), each on its shard of the items (at most one per item)"
    )
    for note in chosen.notes:
        typer.echo(f"note: {note}")
    typer.echo(
        f"one node:  sbatch --gpus={chosen.replicas * chosen.gpus_per_replica} slurm/multi_gpu.sbatch {config}\n"
        f"many nodes: diagsafe-local submit {config} --shards N --gpus-per-task {chosen.gpus_per_replica}"
    )


def _plan_comparison(
    config: Path | None,
    overrides: list[str],
    baseline_asr: float | None,
    margin: float | None,
    discordance: float | None,
    items: int | None,
) -> None:
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.stats import items_needed, min_detectable_increase, non_inferiority_power, null_pairs

    if baseline_asr is None or margin is None:
        raise DiagsafeError("sizing a comparison needs both --baseline-asr and --margin")
    needed = items_needed(baseline_asr, margin, discordance)
    shares = null_pairs(baseline_asr, discordance)
    psi = float(shares[1] + shares[2])
    if needed is None:
        raise DiagsafeError(
            f"no prompt set of up to 10 million items gives 80% power to keep the upper bound of the increase under "
            f"{margin:.1%} at a baseline ASR of {baseline_asr:.1%}: widen the margin"
        )
    typer.echo(
        f"a paired comparison with a baseline at ASR {baseline_asr:.1%} needs {needed} items (final turns, one "
        f"sample each): then a candidate as safe as the baseline keeps the 95% upper bound of the increase "
        f"(Newcombe's paired interval, as the gate computes it) under {margin:.1%} in "
        f"{non_inferiority_power(needed, baseline_asr, margin, discordance):.0%} of 2000 simulated comparisons "
        f"(discordant share {psi:.1%}"
        + (
            ")"
            if discordance is not None
            else ", that of unrelated verdicts; yours is likely lower: compare measures it)"
        )
    )
    have = items
    if have is None and config is not None:
        from diagsafe_local.evaluation.config import load_config
        from diagsafe_local.evaluation.prompt_sets import load_configured

        cfg = load_config(config, overrides)
        have = sum(1 for item in load_configured(cfg.dataset)[0] if not item.benign) * cfg.targets[0].sampling.n
    if have is not None:
        detectable = min_detectable_increase(have, psi)
        typer.echo(
            f"you have {have}: "
            + ("enough" if have >= needed else f"{needed - have} too few")
            + "; with them a McNemar test detects an increase of "
            + ("none up to 100%" if detectable is None else f"{detectable:.1%}")
            + " with 80% power"
        )
