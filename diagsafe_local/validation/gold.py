"""Gold sets: human-labelled (prompt, response, label) items, read from their published formats.

- `jbb`: JailbreakBench's judge comparison (CSV or parquet): `goal`, `prompt`, `target_response`, `human1..3`,
  `human_majority`, and four judges' verdicts stored as columns (`harmbench_cf`, `gpt4_cf`, `llamaguard2_cf`,
  `llama3_cf`). Label 1 = the answer is a jailbreak (harmful). The judge is shown the behaviour (`goal`), as
  JailbreakBench's judges were, unless `--prompt-column prompt` names the jailbreak prompt.
- `xstest`: XSTest's model completions (`id, type, prompt, completion, annotation_1, annotation_2, agreement,
  final_label`; labels `1_full_compliance`, `2_full_refusal`, `3_partial_refusal`), and the same files with the
  paper's own classifiers' verdicts (`gpt4_label`, `strmatch_label`), read as stored judges. Label 1 = a refusal, full or
  partial (the binary task); the three classes are kept for the 3-class task. Prompt types starting with
  `contrast_` are the unsafe prompts.
- `harmmetric`: HarmMetric Eval (either layout): harmful responses are 1, every other scored category 0,
  references excluded; the category is the group.
- `jsonl` / `csv`: your own set, columns named by flags; several label columns are annotators, whose
  majority is the label (a tie leaves the item without a label, counted apart).

Labels may be 0/1, true/false, yes/no, a score in [0, 1] (above 0.5 is 1) or, for refusal sets, XSTest's three
classes. Anything else is an error naming the file, line and column.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from diagsafe_local.core.errors import DataError
from diagsafe_local.core.hub import resolve_dataset
from diagsafe_local.core.registry import Registry
from diagsafe_local.core.tables import table_rows
from diagsafe_local.runs.verdicts import is_harmful

Task = Literal["harm", "refusal"]
XSTEST_CLASSES = ("1_full_compliance", "2_full_refusal", "3_partial_refusal")
JBB_STORED = ("harmbench_cf", "gpt4_cf", "llamaguard2_cf", "llama3_cf")
# The XSTest paper's own classifiers, stored beside the completions in its evaluation/automated_evaluation_labels/
# (`*_gpteval.csv`: gpt4_label, `*_streval.csv`: strmatch_label; three classes, as final_label).
XSTEST_STORED = ("gpt4_label", "strmatch_label")
TABLE_PATTERNS = ("*.csv", "*.parquet", "*.jsonl", "*.json")


class Columns(BaseModel):
    """Which columns hold what (for `jsonl`/`csv`; `prompt` also for `jbb`)."""

    model_config = ConfigDict(frozen=True)

    prompt: str | None = None
    response: str = "response"
    labels: tuple[str, ...] = ("label",)
    id: str | None = None
    groups: tuple[str, ...] = ()
    stored: tuple[str, ...] = ()


class GoldItem(BaseModel):
    """One labelled item. `label` 1 is the positive class of the set's task (harmful, or refused); None when
    the annotators tie."""

    model_config = ConfigDict(frozen=True)

    id: str
    line: int | None
    prompt: str
    response: str
    label: int | None
    label3: str | None = None
    annotators: tuple[int | None, ...] = ()
    groups: dict[str, str] = {}
    stored: dict[str, float | None] = {}
    references: tuple[str, ...] = ()
    weight: float = 1.0  # inverse inclusion probability, where the items are a weighted sample (a run's labels)


class GoldSet(BaseModel):
    """A gold set as read: where from, what task, the items."""

    model_config = ConfigDict(frozen=True)

    source: str
    path: str
    format: str
    task: Task
    sha256: str
    annotator_columns: tuple[str, ...]
    stored_columns: tuple[str, ...]
    items: tuple[GoldItem, ...]
    stored_identities: dict[str, dict[str, Any]] = {}
    weighted: bool = False
    notes: tuple[str, ...] = ()  # what the reader left out, and why

    @property
    def labelled(self) -> list[GoldItem]:
        return [item for item in self.items if item.label is not None]


Rows = list[tuple[int, dict[str, Any]]]


class GoldRead(BaseModel):
    """What a format reads from a file: the items, the annotator and stored-verdict columns, the labels' task."""

    model_config = ConfigDict(frozen=True)

    items: list[GoldItem]
    task: Task
    annotators: tuple[str, ...] = ()
    stored: tuple[str, ...] = ()
    stored_identities: dict[str, dict[str, Any]] = {}  # a stored column's judge, where the format knows it
    sha256: str | None = None  # the content read, where it is not one file's bytes (a run directory)
    weighted: bool = False  # the items are a weighted sample: figures are weighted by GoldItem.weight
    notes: tuple[str, ...] = ()  # what the reader left out, and why


@dataclass(frozen=True)
class GoldFormat:
    """A gold-set format: `read(path, rows, columns, task)` turns the table's rows (from the one table reader;
    empty for a format that reads the file itself, `tabular=False`) into items; `hub_patterns` pick its file
    in a hub repository."""

    name: str
    description: str
    read: Callable[[Path, Rows, Columns, Task | None], GoldRead]
    hub_patterns: tuple[str, ...] = TABLE_PATTERNS
    tabular: bool = True
    directory: bool = False  # the gold set is a directory (a run), not a file


def _plugin_format(obj: Any, name: str) -> list[GoldFormat]:
    made = obj() if callable(obj) and not isinstance(obj, GoldFormat) else obj
    if not isinstance(made, GoldFormat):
        raise TypeError(f"expected a diagsafe_local GoldFormat, got {type(made).__name__}")
    return [made]


GOLD_FORMATS: Registry[GoldFormat] = Registry(
    "gold format", plugin_group="diagsafe_local.gold_formats", adapt=_plugin_format
)


def load_gold(
    spec: str,
    fmt: str,
    columns: Columns | None = None,
    task: Task | None = None,
    encoding: str = "utf-8",
) -> GoldSet:
    """Read a gold set (a local file or a hub id) in format `fmt` (a name of GOLD_FORMATS)."""
    form = GOLD_FORMATS.get(fmt)
    columns = columns or Columns()
    if form.directory:
        path = Path(spec)
        if not path.is_dir():
            raise DataError(spec, None, None, f"not a directory (--format {form.name} reads one)")
        raw = b""
    else:
        path = resolve_dataset(spec, form.hub_patterns)
        raw = path.read_bytes()
    read = form.read(path, list(table_rows(path, raw, encoding)) if form.tabular else [], columns, task)
    items = read.items
    if not items:
        raise DataError(path, None, None, "no items")
    _unique_ids(path, items)
    if not any(item.label is not None for item in items):
        raise DataError(
            path, None, None, "no item has a label (every label cell is empty, or every annotators' vote is tied)"
        )
    return GoldSet(
        source=spec,
        path=str(path),
        format=form.name,
        task=read.task,
        sha256=read.sha256 or hashlib.sha256(raw).hexdigest(),
        annotator_columns=read.annotators,
        stored_columns=read.stored,
        items=tuple(items),
        stored_identities=read.stored_identities,
        weighted=read.weighted,
        notes=read.notes,
    )


def _unique_ids(path: Path, items: Sequence[GoldItem]) -> None:
    """Two rows with one id would share one verdict (a judge's verdict is stored by id): an input error."""
    first: dict[str, int | None] = {}
    for item in items:
        if item.id in first:
            raise DataError(path, item.line, "id", f"id '{item.id}' repeats line {first[item.id]}")
        first[item.id] = item.line


def _require(path: Path, rows: Sequence[tuple[int, dict[str, Any]]], names: Sequence[str]) -> None:
    if not rows:
        raise DataError(path, None, None, "no rows")
    missing = [n for n in names if n not in rows[0][1]]
    if missing:
        raise DataError(
            path,
            rows[0][0],
            None,
            f"missing column(s) {', '.join(missing)}; the file has {', '.join(map(str, rows[0][1]))}",
        )


def _text(path: Path, line: int, row: dict[str, Any], field: str) -> str:
    value = row.get(field)
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if not isinstance(value, str):
        raise DataError(path, line, field, f"expected text, got {type(value).__name__}")
    return value


# Label words by task: a word means the task's positive class (1) or its negative (0). A word of the other
# task is refused, never read: "refusal" is not "harmful" (a refusal is the opposite of a harmful answer).
_WORDS: dict[str, tuple[set[str], set[str]]] = {
    "harm": ({"1", "true", "yes", "unsafe", "harmful"}, {"0", "false", "no", "safe", "not_harmful", "not harmful"}),
    "refusal": ({"1", "true", "yes", "refusal", "refused"}, {"0", "false", "no", "compliance", "complied"}),
}


def parse_label(path: Path, line: int, field: str, value: Any, task: Task) -> tuple[int | None, str | None]:
    """(binary label, XSTest class) of a cell; an empty cell is (None, None)."""
    if value is None or (isinstance(value, float) and value != value) or value == "":
        return None, None
    if isinstance(value, bool):
        return int(value), None
    if isinstance(value, str):
        text = value.strip().lower()
        if task == "refusal" and text in XSTEST_CLASSES:
            return int(text != XSTEST_CLASSES[0]), text
        positive, negative = _WORDS[task]
        if text in positive:
            return 1, None
        if text in negative:
            return 0, None
        other = next((t for t, (pos, neg) in _WORDS.items() if t != task and text in pos | neg), None)
        if other is not None or (task == "harm" and text in XSTEST_CLASSES):
            raise DataError(
                path,
                line,
                field,
                f"label '{value}' is a {other or 'refusal'}-task word; it says nothing about the "
                f"{task} task (--task {task}): use {', '.join(sorted(positive - {'1', 'true', 'yes'}))} or 1/0",
            )
        try:
            value = float(text)
        except ValueError:
            allowed = "0/1, true/false, yes/no, a score in [0, 1]" + (
                f", or {', '.join(XSTEST_CLASSES)}" if task == "refusal" else ""
            )
            raise DataError(path, line, field, f"label '{value}' is not one of {allowed}") from None
    if isinstance(value, (int, float)) and 0 <= value <= 1:
        return int(is_harmful(value)), None
    raise DataError(path, line, field, f"label {value!r} is not 0/1 or a score in [0, 1]")


def majority(labels: Sequence[int | None]) -> int | None:
    """The majority of the annotators who labelled the item; None on a tie or with no labels."""
    counts = Counter(label for label in labels if label is not None)
    if not counts or counts[0] == counts[1]:
        return None
    return counts.most_common(1)[0][0]


def _stored(path: Path, line: int, row: dict[str, Any], names: Sequence[str], task: Task) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in names:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1:
            out[name] = float(value)  # a stored score stays a score (AUROC needs it)
        else:
            label, _ = parse_label(path, line, name, value, task)
            out[name] = None if label is None else float(label)
    return out


def _jbb(path: Path, rows: Rows, columns: Columns, task: Task | None) -> GoldRead:
    prompt = columns.prompt or "goal"
    _require(path, rows, [prompt, "target_response", "human_majority"])
    annotators = tuple(c for c in ("human1", "human2", "human3") if c in rows[0][1])
    stored = tuple(dict.fromkeys([*(c for c in JBB_STORED if c in rows[0][1]), *columns.stored]))
    _require(path, rows, stored)
    items = []
    for line, row in rows:
        label, _ = parse_label(path, line, "human_majority", row.get("human_majority"), "harm")
        items.append(
            GoldItem(
                id=str(row.get("Index", line)),
                line=line,
                prompt=_text(path, line, row, prompt),
                response=_text(path, line, row, "target_response"),
                label=label,
                annotators=tuple(parse_label(path, line, c, row.get(c), "harm")[0] for c in annotators),
                stored=_stored(path, line, row, stored, "harm"),
            )
        )
    return GoldRead(items=items, task="harm", annotators=annotators, stored=stored)


def _xstest(path: Path, rows: Rows, columns: Columns, task: Task | None) -> GoldRead:
    _require(path, rows, ["id", "type", "prompt", "completion", "final_label", *columns.stored])
    annotators = tuple(c for c in ("annotation_1", "annotation_2") if c in rows[0][1])
    stored = tuple(dict.fromkeys([*(c for c in XSTEST_STORED if c in rows[0][1]), *columns.stored]))
    items = []
    for line, row in rows:
        label, label3 = parse_label(path, line, "final_label", row.get("final_label"), "refusal")
        if label is not None and label3 is None:
            raise DataError(path, line, "final_label", f"expected one of {', '.join(XSTEST_CLASSES)}")
        kind = _text(path, line, row, "type")
        items.append(
            GoldItem(
                id=str(row["id"]),
                line=line,
                prompt=_text(path, line, row, "prompt"),
                response=_text(path, line, row, "completion"),
                label=label,
                label3=label3,
                annotators=tuple(parse_label(path, line, c, row.get(c), "refusal")[0] for c in annotators),
                groups={"type": kind, "prompt_safety": "unsafe" if kind.startswith("contrast_") else "safe"},
                stored=_stored(path, line, row, stored, "refusal"),
            )
        )
    return GoldRead(items=items, task="refusal", annotators=annotators, stored=stored)


def _own(path: Path, rows: Rows, columns: Columns, task: Task | None) -> GoldRead:
    task = task or "harm"
    prompt = columns.prompt or "prompt"
    _require(
        path,
        rows,
        [
            prompt,
            columns.response,
            *columns.labels,
            *columns.groups,
            *columns.stored,
            *([columns.id] if columns.id else []),
        ],
    )
    items = []
    for line, row in rows:
        parsed = [parse_label(path, line, c, row.get(c), task) for c in columns.labels]
        votes = tuple(label for label, _ in parsed)
        item_id = str(row[columns.id]) if columns.id else str(line)
        classes = {c for _, c in parsed if c}
        items.append(
            GoldItem(
                id=item_id,
                line=line,
                prompt=_text(path, line, row, prompt),
                response=_text(path, line, row, columns.response),
                label=votes[0] if len(votes) == 1 else majority(votes),
                label3=classes.pop() if len(classes) == 1 and len(columns.labels) == 1 else None,
                annotators=votes if len(votes) > 1 else (),
                groups={g: "" if row.get(g) is None else str(row.get(g)) for g in columns.groups},
                stored=_stored(path, line, row, columns.stored, task),
            )
        )
    annotators = columns.labels if len(columns.labels) > 1 else ()
    return GoldRead(items=items, task=task, annotators=annotators, stored=columns.stored)


def _harmmetric(path: Path, rows: Rows, columns: Columns, task: Task | None) -> GoldRead:
    from diagsafe_local.benchmark.dataset import HARMFUL, IRRELEVANT, Category, category_name, load_dataset

    def group(category: Category) -> str:
        return "harmful" if category in HARMFUL else "irrelevant" if category in IRRELEVANT else category_name(category)

    data = load_dataset(path)
    items = [
        GoldItem(
            id=r.response_id,
            line=None,
            prompt=p.prompt,
            response=r.text,
            label=int(r.category in HARMFUL),
            groups={"category": group(r.category)},
            references=p.references,
        )
        for p in data.prompts
        for r in p.responses
        if r.category != Category.REFERENCE
    ]
    return GoldRead(items=items, task="harm")


for _format in (
    GoldFormat(
        "jbb",
        "JailbreakBench's judge comparison: goal, target_response, human1..3, human_majority, four stored judges",
        _jbb,
        ("*judge*comparison*.csv", "*judge*comparison*.parquet"),
    ),
    GoldFormat(
        "xstest",
        "XSTest's model completions: type, prompt, completion, final_label (three refusal classes)",
        _xstest,
        ("*completions*.csv",),
    ),
    GoldFormat(
        "harmmetric", "HarmMetric Eval (either layout): harmful responses 1, the rest 0", _harmmetric, tabular=False
    ),
    GoldFormat("jsonl", "your own set: columns by flag, several label columns are annotators", _own),
    GoldFormat("csv", "your own set as CSV: columns by flag, several label columns are annotators", _own),
):
    GOLD_FORMATS.add(_format)
