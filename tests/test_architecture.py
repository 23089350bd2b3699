"""The package's layers import one way: commands -> evaluation / benchmark / classifier / attacks / selftest -> judging /
metrics -> engines -> core. No module imports from a higher layer, and no package imports form a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "diagsafe_local"
LAYER = {
    "core": 0,
    "engines": 1,
    "judging": 2,
    "metrics": 2,
    "attacks": 3,
    "evaluation": 3,
    "benchmark": 3,
    "classifier": 3,
    "validation": 3,
    "selftest": 4,
    "review": 4,
    "commands": 5,
    "cli": 6,
    "__init__": 6,
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
    """Regenerate with `python -m diagsafe_local.evaluation.records` after changing a record."""
    import json

    from diagsafe_local.evaluation.records import SCHEMAS, json_schema, schema_path

    for name in SCHEMAS:
        assert json.loads(schema_path(name).read_text()) == json_schema(name), name
