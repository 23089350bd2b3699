"""`diagsafe-local pack CONFIG --out DIR`: everything a run config needs on an air-gapped node, in one folder."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors


@user_errors
def pack(
    config: Annotated[Path, typer.Argument(help="Run config (YAML).")],
    out: Annotated[Path, typer.Option(help="The pack's folder (an older pack there is replaced whole).")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a setting: key.path=value (repeatable).")
    ] = None,
) -> None:
    """Copy everything CONFIG needs into one folder, for a node without network. Its models and adapters with
    their tokenizers, chat templates and generation configs (only the files a run loads: the weights vLLM picks,
    no model card or second format; what is left out is said), `judge.validation: auto` as the judge cache holds
    it now, its prompt set, WordNet where METEOR judges, the
    embedding model where it judges, gpt-oss's vocabulary where the harmony format is served; pack.lock lists every
    file with its SHA-256, size and origin. Fetched from the hub where it is reachable, else from local folders
    and the hub cache. Then, on the node: `run CONFIG --pack DIR`."""
    from diagsafe_local.evaluation.config import load_config
    from diagsafe_local.evaluation.pack import build

    lock = build(load_config(config, set_ or []), config, out, typer.echo)
    size = sum(f.size for f in lock.files)
    typer.echo(f"packed {len(lock.parts)} parts, {len(lock.files)} files, {size / 1e6:.1f} MB into {out}")
    typer.echo(f"run it offline: diagsafe-local run {config} --pack {out}")
