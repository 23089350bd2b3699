"""The package's layers import one way: commands -> review / selftest -> evaluation / benchmark / classifier /
validation -> judging / metrics -> engines -> runs (the read side) -> core / stats. No module imports from a higher
layer, and no package imports form a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

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
    "commands": 6,
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
