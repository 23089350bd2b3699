"""The `diagsafe-local` command line.

Each command lives in its own module of `diagsafe_local.commands`. `main` (the console script) imports only
the module of the command it runs: importing all of them costs ~0.3 s a process (pydantic records, the judge
registry) that `bench` or `gate` never use. Help, a mistyped name and `app` (for tests) load every command.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer

# name -> (module in diagsafe_local.commands, attribute); a module-level `app` attribute is a command group.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("bench", "bench"),
    "validate": ("validate", "validate"),
    "judges": ("judges", "judges"),
    "run": ("run", "run"),
    "pack": ("pack", "pack"),
    "report": ("report", "report"),
    "gate": ("gate", "gate"),
    "verify-attestation": ("attest", "verify_attestation"),
    "merge": ("runs", "merge"),
    "compare": ("runs", "compare"),
    "plan": ("plan", "plan"),
    "submit": ("submit", "submit"),
    "watch": ("watch", "watch"),
    "train-classifier": ("train_classifier", "train_classifier"),
    "doctor": ("doctor", "doctor"),
    "selftest": ("selftest", "selftest"),
    "data": ("data", "app"),
    "models": ("models", "app"),
    "view": ("review", "view"),
    "label": ("review", "label"),
    "export": ("review", "export"),
    "demo": ("demo", "demo"),
}


def build(names: list[str] | None = None) -> typer.Typer:
    """The command line with the named commands (all by default)."""
    import typer

    cli = typer.Typer(
        name="diagsafe-local",
        help="Measure how harmful an LLM's answers are, offline; benchmark harmfulness metrics and judges.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )

    @cli.callback()
    def _group() -> None:
        """Measure how harmful an LLM's answers are, offline; benchmark harmfulness metrics and judges."""
        # A callback keeps the commands a group when only one is loaded (typer would run a lone command bare).

    for name in names or COMMANDS:
        module_name, attribute = COMMANDS[name]
        command = getattr(importlib.import_module(f"diagsafe_local.commands.{module_name}"), attribute)
        if attribute == "app":
            cli.add_typer(command, name=name, short_help=_first_sentence(command.info.help or ""))
        else:
            cli.command(name, short_help=_first_sentence(command.__doc__ or ""))(command)
    return cli


def _first_sentence(help_text: str) -> str:
    """A command's line in the top-level help: the first sentence of its help, on one line (its own `--help`
    has the rest). A full stop inside parentheses (`AUROC ...`) or within a word ends no sentence."""
    text = " ".join(help_text.split("\n\n")[0].split())
    depth = 0
    for index, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char in ".?!" and depth == 0 and text[index + 1 : index + 2] in ("", " "):
            return text[: index + 1]
    return text


def main() -> None:
    """Run the command named on the command line, importing only its module."""
    named = sys.argv[1] if len(sys.argv) > 1 else None
    build([named] if named in COMMANDS else None)()


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `from diagsafe_local.cli import app`: every command, built on first use
        globals()["app"] = built = build()
        return built
    raise AttributeError(name)


if __name__ == "__main__":
    main()
