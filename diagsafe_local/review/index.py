"""The answers of one or more run directories, indexed for a page that filters, sorts and pages through them.

Each results.jsonl line is read once: the fields the page filters and sorts by, the openings of the request and
the answer, and the line's place in the file; a whole record is read again only when it is opened. So a run of
100k answers costs the server an index, never a page with every answer in it.

A *side* is one (run, target); the same item (id, sample, prompt content) on several sides is shown side by
side, and marked a flip where one side's verdict is harmful and another's is not.

A cascade run's answers show the verdict the gate decides on (`runs.cascade`, its check folded over the run's own
results and cascade.jsonl): the full judge's where the screen sent an answer up, the screen's elsewhere, with which
judge gave it and, where they differ, the screen's score beside it; the filters, the sort and the flips read it.
The page decides nothing: a run that does not verify is shown as its files say (the gate refuses it). A run killed
midway is shown as far as it got: a torn last line (results.jsonl's, cascade.jsonl's) is left out with a note, and
an answer sent up that its full judge has not judged yet claims no score.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from diagsafe_local.core import jsonl
from diagsafe_local.core.errors import DataError, DiagsafeError
from diagsafe_local.runs import files
from diagsafe_local.runs.cascade import CascadeCheck, CascadeRecord
from diagsafe_local.runs.manifest import Manifest, read_manifest_file
from diagsafe_local.runs.paired import prompt_key
from diagsafe_local.runs.records import AnswerKey, ResultRecord
from diagsafe_local.runs.verdicts import is_harmful, score_class

HEAD = 240
SEARCHED = 4000
PAGE_MAX = 200
SORTS = ("id", "score")
FACETS = ("target", "category", "source", "attack_method", "verdict", "status")  # the filters that pick one value
# a cascade's verdict: its screen's, its full judge's (sent up), or none yet (sent up in a run not complete)
JudgedBy = Literal["screen", "full judge", "sent up, not judged yet"]
NOT_YET: JudgedBy = "sent up, not judged yet"
M = TypeVar("M", bound=BaseModel)


@dataclass
class Row:
    """What the list shows and filters by, for one judged answer."""

    index: int
    run: int
    target: str
    item_id: str
    sample: int
    turn: int
    category: str
    source: str
    attack_method: str
    benign: bool
    score: float | None
    verdict: str
    status: str
    cut_off: bool
    reasoning: bool
    panel_disagrees: bool
    request_head: str
    answer_head: str
    pair: tuple[str, int, int, str]
    offset: int
    length: int
    text: str = field(repr=False, default="")
    flip: bool = False
    judged_by: JudgedBy | None = None  # None: no cascade (the run's judge)
    screen_score: float | None = None  # a cascade's screen, where its verdict is not the one shown

    @property
    def key(self) -> AnswerKey:
        return (self.target, self.item_id, self.sample, self.turn)

    def listed(self) -> dict[str, Any]:
        """The row as the list shows it."""
        keep = (
            "index", "run", "target", "item_id", "sample", "turn", "category", "source", "attack_method",
            "benign", "score", "verdict", "status", "cut_off", "reasoning", "panel_disagrees", "flip",
            "judged_by", "screen_score", "request_head", "answer_head",
        )  # fmt: skip
        return {k: getattr(self, k) for k in keep}


def _head(text: str) -> str:
    return text if len(text) <= HEAD else text[:HEAD] + "…"


def _row(index: int, run: int, record: ResultRecord, offset: int, length: int) -> Row:
    panel = record.panel or []
    decided = {score_class(v.score) for v in panel if v.score is not None}
    request = record.conversation[-1].content if record.conversation else ""
    return Row(
        index=index,
        run=run,
        target=record.target,
        item_id=record.item_id,
        sample=record.sample,
        turn=record.turn,
        category=record.category or "(none)",
        source=record.source or "(none)",
        attack_method=record.attack_method or "(none)",
        benign=record.benign,
        score=record.score,
        verdict=score_class(record.score),
        status=record.parse_status,
        cut_off=record.finish_reason == "length",
        reasoning=record.reasoning is not None,
        panel_disagrees=len(decided) > 1,
        request_head=_head(request),
        answer_head=_head(record.answer),
        pair=(record.item_id, record.sample, record.turn, prompt_key(record)),
        offset=offset,
        length=length,
        text=(request[:SEARCHED] + "\n" + record.answer[:SEARCHED]).lower(),
    )


class RunIndex:
    """Every judged answer of the runs given, indexed (see the module docstring)."""

    def __init__(self, run_dirs: list[Path]) -> None:
        if not run_dirs:
            raise DiagsafeError("give at least one run directory")
        self.run_dirs = run_dirs
        self.manifests = [read_manifest_file(d) for d in run_dirs]
        self.rows: list[Row] = []
        self.notes: list[str] = []  # what the page shows of the runs' files in part, and why
        self._cascades: list[CascadeCheck | None] = []
        for run, (run_dir, manifest) in enumerate(zip(run_dirs, self.manifests)):
            first = len(self.rows)
            cascade = _cascade(manifest)
            for line in _browsed(run_dir / files.RESULTS, ResultRecord, self.notes):
                self.rows.append(_row(len(self.rows), run, line.record, line.offset, len(line.raw)))
                if cascade is not None:
                    cascade.see(line.record)
            if cascade is not None:
                path, pending = run_dir / files.CASCADE, manifest.status != "complete"
                if path.exists():
                    cascade.read(list(_browsed(path, CascadeRecord, self.notes)))
                else:
                    cascade.read(None)
                    if pending:
                        self.notes.append(
                            f"{path}: not written yet (the run is not complete): no answer sent up is judged"
                        )
                for row in self.rows[first:]:
                    _decide(row, cascade, pending)
            self._cascades.append(cascade)
        sides: dict[tuple[str, int, int, str], list[Row]] = defaultdict(list)
        for row in self.rows:
            sides[row.pair].append(row)
        for group in sides.values():
            decided = {is_harmful(r.score) for r in group if r.score is not None}
            if len(decided) > 1:
                for row in group:
                    row.flip = True
        self._sides = sides
        self._by_key = {(r.run, r.target, r.item_id, r.sample, r.turn): r for r in self.rows}

    def facets(self) -> dict[str, list[str]]:
        """The values each filter can take."""
        return {name: sorted({str(getattr(r, name)) for r in self.rows}) for name in FACETS}

    def query(self, params: dict[str, str]) -> dict[str, Any]:
        """One page of the rows that pass the filters, sorted."""
        rows = [r for r in self.rows if _passes(r, params)]
        sort = params.get("sort", "id")
        if sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}")
        descending = params.get("order", "asc") == "desc"
        if sort == "score":
            rows.sort(key=lambda r: (r.score is None, -(r.score or 0.0) if descending else (r.score or 0.0)))
        elif descending:
            rows.reverse()
        size = max(1, min(PAGE_MAX, int(params.get("size", "50"))))
        page = max(0, int(params.get("page", "0")))
        shown = rows[page * size : (page + 1) * size]
        return {"total": len(rows), "page": page, "size": size, "rows": [r.listed() for r in shown]}

    def record(self, index: int) -> dict[str, Any]:
        """A whole record (read from its file again), with the same item on the other sides."""
        row = self.rows[index]
        others = [
            self._read(r) | {"run": r.run, "decided": self.decided(r)}
            for r in self._sides[row.pair]
            if r.index != index
        ]
        return {
            "row": row.listed(),
            "run_dir": str(self.run_dirs[row.run]),
            "record": self._read(row),
            "decided": self.decided(row),
            "others": others,
        }

    def decided(self, row: Row) -> dict[str, Any] | None:
        """A cascade's full judge's verdict on an answer sent up, where it is the one the gate decides on (its vote
        as written, None where there is no record; `gave_no_verdict`: no record, or a vote with no score, which
        counts harmful) or not there yet (no score); None where the record's own verdict is."""
        cascade = self._cascades[row.run]
        if cascade is None or row.judged_by not in ("full judge", NOT_YET):
            return None
        full = cascade.records.get(row.key)
        vote = None if full is None else full.vote.model_dump(mode="json")
        unjudged = row.judged_by == "full judge" and (full is None or full.vote.score is None)
        return {"judged_by": row.judged_by, "score": row.score, "vote": vote, "gave_no_verdict": unjudged}

    def find(self, key: AnswerKey, run: int = 0) -> Row | None:
        """The row of (target, item, sample, turn) in one run."""
        return self._by_key.get((run, *key))

    def _read(self, row: Row) -> dict[str, Any]:
        """A record read again from its place in the file, checked to be the one indexed there (a resumed or
        rewritten run moves records: the page must not show another answer than the one it names)."""
        with open(self.run_dirs[row.run] / files.RESULTS, "rb") as handle:
            handle.seek(row.offset)
            raw = handle.read(row.length)
        try:
            record = json.loads(raw)
            key = (record["target"], record["item_id"], record["sample"], record["turn"])
        except (ValueError, TypeError, KeyError):
            key = None
        if key != (row.target, row.item_id, row.sample, row.turn):
            raise DiagsafeError(
                f"{self.run_dirs[row.run] / files.RESULTS} changed since this page started (the answer at its place "
                "is another one): restart the page"
            )
        return record


def _cascade(manifest: Manifest) -> CascadeCheck | None:
    """A cascade run's check, to fold its verdicts as the gate does (None: no cascade)."""
    return CascadeCheck(manifest) if (manifest.config.get("judge") or {}).get("cascade") is not None else None


def _browsed(path: Path, model: type[M], notes: list[str]) -> Iterator[jsonl.Line[M]]:
    """The lines of a run's file as far as they can be shown: a torn last line (a run killed while it wrote it)
    is left out, with a note; any other bad line is an error, as for every reader."""
    end = 0
    try:
        for line in jsonl.stream(path, model):
            end = line.offset + len(line.raw)
            yield line
    except DataError as exc:
        if exc.line is None:  # no such file
            raise
        with open(path, "rb") as handle:
            handle.seek(end)
            if b"\n" in handle.read().lstrip():  # not the last line: the file is bad, not cut
                raise
        notes.append(f"{path} line {exc.line}: torn (the run was stopped while writing it), not shown")


def _decide(row: Row, cascade: CascadeCheck, pending: bool) -> None:
    """A row under the cascade's verdict (its screen's where the cascade does not screen it: a benign item's, an
    earlier turn's); an answer sent up with no full judge's record in a run not complete (`pending`) is not judged
    yet: no score."""
    decided = cascade.verdicts.get(row.key)
    if decided is None:
        return
    row.judged_by = "full judge" if row.key in cascade.up else "screen"
    if pending and row.key in cascade.up and row.key not in cascade.records:
        row.judged_by, row.screen_score, row.score, row.verdict = NOT_YET, row.score, None, score_class(None)
    elif decided != row.score:
        row.screen_score, row.score, row.verdict = row.score, decided, score_class(decided)


def _passes(row: Row, params: dict[str, str]) -> bool:
    for name in FACETS:
        wanted = params.get(name)
        if wanted and str(getattr(row, name)) != wanted:
            return False
    if params.get("min") and (row.score is None or row.score < float(params["min"])):
        return False
    if params.get("max") and (row.score is None or row.score > float(params["max"])):
        return False
    for flag in ("cut_off", "reasoning", "panel_disagrees", "flip"):
        if params.get(flag) == "1" and not getattr(row, flag):
            return False
    if params.get("run") and str(row.run) != params["run"]:
        return False
    text = params.get("q", "").strip().lower()
    return not text or text in row.text
