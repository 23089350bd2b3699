"""MkDocs hooks of the docs site: README.md is the front page, and the reference pages are generated from the
code itself (the pydantic field descriptions of the configs and records, the CLI's own options), so the
reference cannot drift from what the tool accepts and writes.

A page asks for a generated part with a line `{{ reference: NAME }}` (NAME one of `REFERENCES`).
"""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^\{\{ reference: ([a-z-]+) \}\}$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        readme = (ROOT / "README.md").read_text()
        return re.sub(r"\]\(docs/", "](", readme)  # README's links into docs/ are the site's own pages
    return MARKER.sub(lambda m: REFERENCES[m.group(1)](), markdown)


# -- pydantic models as tables ----------------------------------------------------------------------------------


def _type(annotation: Any) -> str:
    """A field's type in words a config author reads."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type(a) for a in args if a is not type(None)) + (" or null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (list, tuple):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type(args[1])}" if len(args) == 2 else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "" if isinstance(value, BaseModel) else f"`{value!r}`"
    return f"`{field.default!r}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The section model a field holds (directly, or inside a union, list or map), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested(arg)
        if found:
            return found
    return None


def model_table(model: type[BaseModel], prefix: str = "", skip: tuple[str, ...] = ()) -> str:
    """Every field of `model` (and of its sections, dotted), with type, default and description."""
    rows: list[str] = []

    def walk(current: type[BaseModel], path: str, seen: tuple[type, ...]) -> None:
        for name, field in current.model_fields.items():
            if f"{path}{name}" in skip:
                continue
            rows.append(
                f"| `{path}{name}` | {_type(field.annotation)} | {_default(field)} | {_cell(field.description or '')} |"
            )
            inner = _nested(field.annotation)
            if inner is not None and inner not in seen:
                walk(inner, f"{path}{name}.", (*seen, inner))

    walk(model, prefix, (model,))
    return "\n".join(["| key | type | default | meaning |", "|---|---|---|---|", *rows])


def _config() -> str:
    from diagsafe_local.evaluation.attack.config import AttackConfig
    from diagsafe_local.evaluation.attack.strategy import STRATEGIES
    from diagsafe_local.evaluation.config import RunConfig
    from diagsafe_local.runs.limits import GateConfig

    parts = [
        "### The run config\n",
        model_table(RunConfig, skip=("gate", "attack")),
        "\n\n### `gate:`: the limits (see [the gate](../gate.md))\n",
        model_table(GateConfig, "gate."),
        "\n\n### `attack:`: the knobs every strategy shares\n",
        model_table(AttackConfig, "attack."),
    ]
    for strategy in STRATEGIES:
        own = {n: f for n, f in strategy.config.model_fields.items() if n not in AttackConfig.model_fields}
        rows = [
            f"| `attack.{n}` | {_type(f.annotation)} | {_default(f)} | {_cell(f.description or '')} |"
            for n, f in own.items()
        ]
        parts += [
            f"\n\n### `attack:` with `strategy: {strategy.name}`\n\n{_cell(strategy.description)}\n",
            "\n".join(["| key | type | default | meaning |", "|---|---|---|---|", *rows]),
        ]
    return "\n".join(parts)


def _run_directory() -> str:
    from diagsafe_local.runs.manifest import Manifest
    from diagsafe_local.runs.records import ControlRecord, GenerationRecord, ResultRecord
    from diagsafe_local.runs.summary import Summary, TargetSummary

    return "\n".join(
        [
            "### `results.jsonl` and `attacks.jsonl`: one record per judged answer (or attack step)\n",
            model_table(ResultRecord),
            "\n\n### `generations.jsonl`: one record per answer\n",
            model_table(GenerationRecord),
            "\n\n### `judge_controls.jsonl`: the judge's verdicts on the control answers\n",
            model_table(ControlRecord),
            "\n\n### `summary.json`\n",
            model_table(Summary, skip=("targets",)),
            "\n\n### `summary.json`: each target (`targets.NAME`)\n",
            model_table(TargetSummary),
            "\n\n### `manifest.json`\n",
            model_table(Manifest),
        ]
    )


def _cli() -> str:
    import typer

    from diagsafe_local.cli import build

    root = typer.main.get_command(build())
    out: list[str] = []

    def command(name: str, cmd: Any) -> None:  # typer's own click: told apart by what they have, not their classes
        if hasattr(cmd, "commands"):
            for sub, inner in cmd.commands.items():
                command(f"{name} {sub}", inner)
            return
        out.append(f"### `diagsafe-local {name}`\n\n{_cell(cmd.help or '')}\n")
        rows = []
        for param in cmd.params:
            if param.param_type_name == "argument":
                rows.append(f"| `{param.name.upper()}` | argument | {'required' if param.required else 'optional'} | |")
            elif param.param_type_name == "option" and param.name != "help":
                names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
                default = "" if param.default in (None, False, ()) else f"`{param.default}`"
                rows.append(f"| {names} | option | {default} | {_cell(param.help or '')} |")
        out.append("\n".join(["| name | kind | default | help |", "|---|---|---|---|", *rows]) + "\n")

    for name, cmd in sorted(root.commands.items()):  # type: ignore[attr-defined]
        command(name, cmd)
    return "\n".join(out)


REFERENCES = {"config": _config, "run-directory": _run_directory, "cli": _cli}
