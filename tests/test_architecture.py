"""The package's layers import one way: commands -> review / selftest / hooks / integrations -> evaluation / benchmark / classifier /
validation -> judging / metrics -> engines -> runs (the read side) -> core / stats. No module imports from a higher
layer, and no package imports form a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "diagsafe_local"
LAYER = {
    "core": 0,
    "stats": 0,
    "runs": 1,
    "engines": 2,
    "judging": 3,
    "metrics": 3,
    "evaluation": 4,
    "benchmark": 4,
    "classifier": 4,
    "validation": 4,
    "selftest": 5,
    "review": 5,
    "hooks": 5,
    "integrations": 5,
    "commands": 6,
    "api": 7,
    "cli": 7,
    "__init__": 7,
}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports() -> dict[str, set[str]]:
    """module -> the diagsafe_local modules it imports (at any depth of its code)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("diagsafe_local", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diagsafe_local"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("diagsafe_local"))
        graph[module] = found
    return graph


def test_every_part_has_a_layer():
    parts = {part_of(m) for m in imports()}
    assert parts <= set(LAYER), parts - set(LAYER)


def test_imports_never_point_up():
    upward = [
        (m, i)
        for m, found in imports().items()
        for i in found
        if i != "diagsafe_local" and LAYER[part_of(i)] > LAYER[part_of(m)]
    ]
    assert not upward, upward


def test_no_import_cycles_between_parts():
    edges = {
        (part_of(m), part_of(i))
        for m, found in imports().items()
        for i in found
        if i != "diagsafe_local" and part_of(m) != part_of(i)
    }
    assert not [(a, b) for a, b in edges if (b, a) in edges]


def test_shipped_json_schemas_are_current():
    """Regenerate with `python -m diagsafe_local.runs.schemas` after changing a record."""
    import json

    from diagsafe_local.runs.schemas import SCHEMAS, json_schema, schema_path

    for name in SCHEMAS:
        assert json.loads(schema_path(name).read_text()) == json_schema(name), name


# -- the read side loads nothing of the execution side --------------------------------------------------------

PROBE = """
import sys
from diagsafe_local import cli
from diagsafe_local.commands import review

review._serve = lambda *args, **kwargs: None  # view and label: everything up to serving the page
sys.argv = ['diagsafe-local', *sys.argv[1:]]
try:
    cli.main()
except SystemExit as exc:
    code = exc.code
print(code, sorted(m for m in sys.modules if m.startswith(('diagsafe_local', 'torch', 'vllm', 'transformers'))))
"""
READ_SIDE = ("diagsafe_local.runs", "diagsafe_local.core", "diagsafe_local.stats", "diagsafe_local.review")
FRONT = {
    "diagsafe_local",
    "diagsafe_local.cli",
    "diagsafe_local.commands",
    "diagsafe_local.commands.common",
    "diagsafe_local.commands.review",  # the probe patches its page server away
}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two finished runs of one dataset and judge, made with scripted engines."""
    from test_adversarial import finished_run

    root = tmp_path_factory.mktemp("read-side")
    mp = pytest.MonkeyPatch()
    try:
        return finished_run(root, mp, name="a"), finished_run(root, mp, name="b")
    finally:
        mp.undo()


@pytest.mark.parametrize(
    "command",
    [
        ["gate", "{a}", "--max-asr", "1", "--allow-degenerate-judge"],
        ["report", "{a}"],
        ["compare", "{a}", "{b}"],
        ["merge", "{a}", "{b}", "--out", "{out}", "--allow-different-judges"],
        ["view", "{a}", "--no-browser"],
        ["label", "{a}", "--annotator", "ann", "--no-browser"],
        ["export", "{a}", "--out", "{out}/log.eval"],
    ],
    ids=lambda c: c[0],
)
def test_the_read_side_commands_load_only_the_read_side(two_runs, tmp_path, command):
    """They decide and show from what was recorded: no engine, judge, plugin, torch or vLLM is loaded."""
    import subprocess
    import sys

    a, b = two_runs
    args = [c.format(a=a, b=b, out=tmp_path / "out") for c in command]
    if command[0] == "merge":  # two runs of one target name and model, of other answers: merged by target
        args = ["merge", str(a), "--out", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    code, modules = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert code in ("0", "None"), done.stdout[-2000:] + done.stderr[-2000:]
    loaded = eval(modules)  # the list of module names the probe printed
    mine = {f"diagsafe_local.commands.{part_of_command(command[0])}"}
    outside = [m for m in loaded if not m.startswith(READ_SIDE) and m not in FRONT | mine]
    assert not outside, outside


def part_of_command(name: str) -> str:
    from diagsafe_local.cli import COMMANDS

    return COMMANDS[name][0]
