"""`diagsafe-local data list|show|fetch`: the public prompt sets, and pre-downloading them for offline nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors

app = typer.Typer(
    help="Public prompt sets: list them, inspect one, pre-download for offline nodes.", no_args_is_help=True
)


@app.command("list")
@user_errors
def list_sets(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, for programs.")] = False,
) -> None:
    """Every prompt set (plugins' included, with their package): size, license, what it measures, cached or not."""
    from diagsafe_local.commands.common import print_listing
    from diagsafe_local.evaluation.prompt_sets import PROMPT_SETS

    rows = [
        {
            "name": spec.name,
            "kind": "prompt set",
            "size": spec.size,
            "license": spec.license,
            "measures": spec.measures,
            "description": spec.description,
            "source": spec.url or (f"hf://datasets/{spec.hub_repo}" if spec.hub_repo else None),
            "cached": spec.cached_path().is_file(),
            "package": PROMPT_SETS.origin(spec.name),
        }
        for spec in PROMPT_SETS
    ]
    columns = ["name", "size", "license", "measures", "cached", "package"]
    print_listing("prompt sets (dataset.set in a run config)", rows, columns, as_json)


@app.command("show")
@user_errors
def show(
    name: Annotated[str, typer.Argument(help="Prompt set name.")],
    file: Annotated[Path | None, typer.Option(help="Read this local copy instead of the cache.")] = None,
    n: Annotated[int, typer.Option(help="Items to print.")] = 3,
) -> None:
    """Details of one set; with a cached or local copy, its item count by category and the first items."""
    from collections import Counter

    from diagsafe_local.evaluation.prompt_sets import PROMPT_SETS, load_set

    spec = PROMPT_SETS.get(name)
    typer.echo(
        f"{spec.name}: {spec.description}\n  license: {spec.license}\n  size: {spec.size}\n  measures: {spec.measures}"
    )
    typer.echo(f"  source: {spec.url or f'hf://datasets/{spec.hub_repo}/{spec.hub_file or spec.filename}'}")
    path = file or spec.cached_path()
    if not path.is_file():
        typer.echo(f"  not downloaded: diagsafe-local data fetch {name}")
        return
    items, _ = load_set(name, path)
    benign = sum(i.benign for i in items)
    typer.echo(f"  {path}: {len(items)} items ({benign} benign), multi-turn: {sum(i.n_turns > 1 for i in items)}")
    for category, count in Counter(i.category or "(none)" for i in items).most_common(12):
        typer.echo(f"    {category}: {count}")
    for item in items[:n]:
        typer.echo(f"  [{item.id}] {item.messages[-1].content[:120]!r}")


@app.command("fetch")
@user_errors
def fetch_set(name: Annotated[list[str], typer.Argument(help="Prompt set name(s).")]) -> None:
    """Download sets into the cache (on a login node with internet), for runs on offline compute nodes."""
    from diagsafe_local.core.cache import file_sha256
    from diagsafe_local.evaluation.prompt_sets import fetch

    for each in name:
        path = fetch(each)
        typer.echo(f"{each}: {path} (sha256 {file_sha256(path)[:16]})")
