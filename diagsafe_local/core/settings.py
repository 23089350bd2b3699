"""Settings files: YAML validated by a pydantic model; every error names the file, the line and the key.

`load_settings(path, model, overrides)` reads the file (a key given twice is an error naming both lines),
applies dotted `--set key.path=value` overrides (values parsed as YAML, list items by index:
`targets.0.model=...`) and validates the result.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from diagsafe_local.core.errors import DiagsafeError

# A settings file is user input: these bound how much work reading one may cost (YAML aliases expand to
# shared objects that validation and dumping then copy: 17 lines of nested aliases are a billion nodes).
MAX_NODES = 100_000
MAX_DEPTH = 64


class StrictModel(BaseModel):
    """A settings model: unknown keys are errors, numbers are finite, and a boolean is never read as a number
    (`max_tokens: true` is a mistake, not 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and _takes_number(annotation) and not _takes(annotation, bool):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        if isinstance(value, str) and _takes(annotation, bool) and not _takes(annotation, str):
            raise ValueError(f"expected true or false, got the text {value!r}")  # pydantic reads "yes", "on" as true
        return value


def _members(annotation: Any) -> tuple[Any, ...]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return tuple(m for arg in typing.get_args(annotation) for m in _members(arg))
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    return (annotation,)


def _takes(annotation: Any, kind: type) -> bool:
    return any(member is kind for member in _members(annotation))


def _takes_number(annotation: Any) -> bool:
    return _takes(annotation, int) or _takes(annotation, float)


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` override in place (value parsed as YAML)."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise DiagsafeError(f"--set expects key.path=value, got '{assignment}'")
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        nxt = _child(node, part, ".".join(parts[: depth + 1]))
        if nxt is None:
            nxt = {}
            _assign(node, part, nxt, key)
        node = nxt
    try:
        value = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        raise DiagsafeError(f"--set {key}: the value is not valid YAML ({_yaml_problem(exc)}); quote it") from None
    _assign(node, parts[-1], value, key)


def _child(node: Any, part: str, where: str) -> Any:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise DiagsafeError(f"--set {where}: no list item {part}")
        return node[int(part)]
    if isinstance(node, dict):
        return node.get(part)
    raise DiagsafeError(f"--set {where}: not a mapping or list")


def _assign(node: Any, part: str, value: Any, key: str) -> None:
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise DiagsafeError(f"--set {key}: no list item {part}")
        node[int(part)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise DiagsafeError(f"--set {key}: '{part}' is inside a value that is not a mapping")


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """YAML key path -> 1-based line, to point errors at the right line."""
    index: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                sub = (*path, str(key_node.value))
                index[sub] = key_node.start_mark.line + 1
                walk(value_node, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                index[(*path, str(i))] = item.start_mark.line + 1
                walk(item, (*path, str(i)))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return index
    if root is not None:
        walk(root, ())
    # A single `target:` is validated as `targets[0]`.
    index.update({("targets", "0", *k[1:]): v for k, v in list(index.items()) if k[:1] == ("target",)})
    return index


class DuplicateKeyError(yaml.YAMLError):
    """A mapping names the same key twice (YAML loaders silently keep the last)."""

    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.line, self.first = key, line, first


class TooLargeError(yaml.YAMLError):
    """A document whose aliases expand past MAX_NODES or MAX_DEPTH, or refer to themselves."""


def _check_size(root: yaml.Node) -> None:
    """Refuse a node graph that is cyclic, or whose expansion (aliases copied out) is over the bounds."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise TooLargeError(f"nested deeper than {MAX_DEPTH} levels")
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise TooLargeError("an alias refers to a node that contains it (a recursive structure)")
        open_.add(id(node))
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(v, depth + 1) for v in node.value)
        open_.discard(id(node))
        if total > MAX_NODES:
            raise TooLargeError(f"its aliases expand to more than {MAX_NODES:,} values")
        sizes[id(node)] = total
        return total

    size(root, 0)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (naming both lines) and documents whose aliases
    expand past MAX_NODES; merge keys (`<<: *base`) work as in YAML 1.1, the mapping's own keys overriding."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_size(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(str(key), line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return str(getattr(exc, "problem", None) or exc)


M = TypeVar("M", bound=BaseModel)


def load_settings(
    path: str | Path,
    model: type[M],
    overrides: list[str] | None = None,
    what: str = "config",
    adjust: Callable[[dict[str, Any], list[str]], None] | None = None,
    raw: bytes | None = None,
) -> M:
    """Read a YAML file, apply `--set` overrides and validate it as `model`; errors name file, line and key.
    `raw`: the file's bytes as the caller read them (None: read here)."""
    path = Path(path)
    if not path.is_file():
        raise DiagsafeError(f"{path}: {'a directory, not a' if path.is_dir() else 'no such'} {what} file")
    from diagsafe_local.core.jsonl import decode

    text = decode(path, path.read_bytes() if raw is None else raw)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as exc:
        raise DiagsafeError(
            f"{path} line {exc.line}: key '{exc.key}' is given twice (first on line {exc.first}); keep one"
        ) from None
    except TooLargeError as exc:
        raise DiagsafeError(f"{path}: refused: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise DiagsafeError(f"{path}{where}: invalid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise DiagsafeError(f"{path}: expected a mapping of settings at the top level")
    for assignment in overrides or []:
        apply_override(data, assignment)
    if adjust is not None:
        adjust(data, overrides or [])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = _line_index(text)
        messages = []
        for err in exc.errors():
            loc = tuple(str(p) for p in err["loc"])
            line = next((lines[loc[:k]] for k in range(len(loc), 0, -1) if loc[:k] in lines), None)
            where = f"{path} line {line}" if line else str(path)
            problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            messages.append(f"{where}: {'.'.join(loc) or '(top level)'}: {problem}")
        raise DiagsafeError(f"invalid {what}:\n  " + "\n  ".join(messages)) from None
