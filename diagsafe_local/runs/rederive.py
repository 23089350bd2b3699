"""What `verify` derives again from what the run recorded, rather than take from a record: a result's item
fields from the run's dataset (as the manifest lists it), and every recorded verdict (a result's, a paraphrase's,
a control's) from its judge's recorded reply (`judge_raw`). A record whose stored field disagrees is refused,
named by file, line and field.

Of a result, from its item in the run's dataset: `benign`, `category`, and `final_turn` (its turn is the item's
last judged turn: a conversation always ends on a user turn). Its judge: the run's judge of that kind of item
(`manifest.judge.rubric`, or `benign_rubric`; a panel's or jury's verdict is checked against its votes by
`runs.jury`, and each member's vote, its own verdict, is derived from its own reply like any other). Of every
verdict: a score exactly where the status is `ok`, and no reply where the engine failed (`error`); and the reply
read again by the judge's reader, from the package or the policy file, never from the run: for a policy judge
(`BUNDLED`: the harm and over-refusal judges shipped with the package, and their paraphrases `NAME~k`; or a
policy file the run's config names, while it is the file the run judged with) its verdict model and score rule
(`records.PolicyVerdicts`, the parser its judge used), for every other built-in judge whose verdict is a function
of its reply's text (the published rubrics, the guards' own formats) its `runs.readers` entry: an `ok` verdict must
be what the reader reads in the reply, verdict and score, and a reply that reads as a verdict is never recorded as
unjudged (the write side's rule too, whatever the judge's finish reason: `judging.base.Judge.parse`).

A model-free judge's verdict whose every input is the answer (the refusal keywords, the keyword metrics as
`METRIC>=THRESHOLD` judges: `runs.model_free`) is derived from the recorded answer, verdict and score, wherever it
is recorded (a result's, a panel's or jury's vote, a cascade's full judge's, a perturbed answer's: `Replies.check`);
it is an engine error only where the target gave no answer (`failed`).

Not derived: a verdict scored by P(positive) from the first token's log-probabilities (the judge's or a juror's
scoring, as the signed manifest records it; its reply is one token, its score is not in the text), a plugin's or
another model-free judge's verdict and score (a reference metric reads the item's reference answers, which the
run does not record; a plugin's is code the read side does not load: only a signature binds them), nor a policy file's that is not here or changed since the run (a note says so);
`invalid` apart from `truncated` (the judge's finish reason is not recorded: both are unjudged, counted against
`max_failure_rate` like an error); a verdict recorded as an engine error with no reply (there is nothing to read
again: it too is unjudged); `source` and `attack_method` (no decision reads them); a result's `answer`, `error` and
`finish_reason` against generations.jsonl (a rewrite of both files together passes as well: only a signature binds
the answer text).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import yaml

from diagsafe_local.core.jsonl import Line
from diagsafe_local.core.resources import data_file
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.model_free import model_free
from diagsafe_local.runs.readers import Reader, reader
from diagsafe_local.runs.records import PanelVote, PolicyVerdicts, ResultRecord, ScoreRule
from diagsafe_local.runs.verdicts import is_combined

BUNDLED = ("harmjudge", "refusal")  # the policy judges shipped as data/policy_NAME.yaml
_PARAPHRASE = re.compile(r"(.+)~[0-9]+")


@functools.cache
def score_rule(judge: str) -> PolicyVerdicts | None:
    """What reads a shipped policy judge's replies again, or one of its paraphrases' (None: not one)."""
    name = _base(judge)
    if name not in BUNDLED:
        return None
    return _verdicts(yaml.safe_load(data_file(f"policy_{name}.yaml").read_text(encoding="utf-8")))


def _verdicts(policy: dict[str, Any]) -> PolicyVerdicts:
    """A policy file's reader (its verdict model and score rule), from the file as YAML reads it."""
    return PolicyVerdicts(policy["name"], policy["fields"], ScoreRule.model_validate(policy["score"]))


def looks_like_path(name: str) -> bool:
    """Whether a judge name is a policy file's path rather than a registered name."""
    return name.endswith((".yaml", ".yml")) or "/" in name


def is_policy_judge(name: str) -> bool:
    """Whether a judge, as a config names it, is a policy judge (shipped, or a policy file): one that always decodes
    its verdicts under their schema."""
    return score_rule(name) is not None or looks_like_path(name)


def _base(judge: str) -> str:
    """A judge's name without its paraphrase's number (`harmjudge~2` -> `harmjudge`)."""
    paraphrase = _PARAPHRASE.fullmatch(judge)
    return paraphrase.group(1) if paraphrase else judge


def _policies(settings: Any) -> set[str]:
    """The policy files' content hashes a judge's settings record (`policies`, a jury member's too)."""
    if not isinstance(settings, dict):
        return set()
    found = {v for v in (settings.get("policies") or {}).values() if isinstance(v, str)}
    return found.union(*(_policies(v) for k, v in settings.items() if k != "policies"))


_UNREAD: Any = object()  # `Replies.reader` has not looked the judge up yet


class Replies:
    """How a run's recorded replies are read again: the shipped policies by name, and each policy file the run's
    config names (bound to the run id) while the file is the one the run judged with (its content hash, as the
    manifest records it); a policy file that is not here or changed is said in `notes`, its verdicts taken as
    recorded."""

    def __init__(self, manifest: Manifest) -> None:
        self.rules: dict[str, PolicyVerdicts] = {}
        self.notes: list[str] = []
        judge = manifest.config.get("judge") or {}
        self.probability: bool | None = judge.get("probability")
        self._readers: dict[tuple[str, bool | None | Literal["run"]], Reader | None] = {}  # `reader`, by its arguments
        jurors = (manifest.judge.settings.get("jurors") if manifest.judge else None) or {}
        # each juror by name: its judge, and whether it samples (its own scoring, as the manifest records it)
        self.jurors: dict[str, tuple[str, bool]] = {
            name: (str(j.get("rubric")), j.get("scoring") == "probability")
            for name, j in jurors.items()
            if isinstance(j, dict)
        }
        named = [judge.get("rubric"), judge.get("benign_rubric"), *((judge.get("panel") or {}).get("members") or [])]
        named += [m.get("rubric") for m in (judge.get("jury") or {}).get("members") or []]
        named.append(((judge.get("cascade") or {}).get("judge") or {}).get("rubric"))
        recorded = _policies(manifest.judge.settings) if manifest.judge else set()
        for name in {n for n in named if isinstance(n, str) and looks_like_path(n)}:
            try:
                raw = Path(name).read_bytes()
                if f"sha256:{hashlib.sha256(raw).hexdigest()}" not in recorded:
                    raise ValueError("its content is not the one the run judged with")
                policy = yaml.safe_load(raw)
                # by its name (what records call it) and its path (what a config calls it)
                self.rules[policy["name"]] = self.rules[name] = _verdicts(policy)
            except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
                self.notes.append(
                    f"the judge's policy file {name} is not read again ({str(exc)[:120]}): its verdicts are taken as recorded"
                )

    def reader(self, judge: str, probability: bool | None | Literal["run"] = "run") -> Reader | None:
        """What reads the judge's replies again (None: nothing the read side has). `probability`: the judge's
        `probability` setting (None: the judge's default), by default the run's `judge.probability`."""
        found = self._readers.get((judge, probability), _UNREAD)  # a run names a few judges, every record one
        if found is not _UNREAD:
            return found
        base = _base(judge)
        found = score_rule(judge) or self.rules.get(base)
        found = found or reader(base, self.probability if probability == "run" else probability)
        self._readers[(judge, probability)] = found
        return found

    def problem(
        self,
        judge: str,
        reply: str | None,
        status: str,
        score: float | None,
        verdict: dict[str, Any] | None = None,
        probability: bool | None | Literal["run"] = "run",
    ) -> str | None:
        """`verdict_problem`, with the run's policy files and the other built-in judges' readers too (`probability`:
        as `reader` takes it)."""
        return _problem(self.reader(judge, probability), judge, reply, status, score, verdict)

    def check(
        self,
        judge: str,
        answer: str,
        failed: bool,
        reply: str | None,
        status: str,
        score: float | None,
        verdict: dict[str, Any] | None = None,
        probability: bool | None | Literal["run"] = "run",
    ) -> str | None:
        """Why a recorded verdict is not its judge's: a model-free judge's derived again from the `answer` it judged
        (`failed`: the target gave none, the one case its verdict may be an engine error), every other judge's read
        again from its `reply` (`problem`)."""
        if model_free(judge):
            return _derived_problem(judge, answer, failed, status, score, verdict)
        return self.problem(judge, reply, status, score, verdict, probability)

    def vote_problem(self, jury: bool, vote: PanelVote, answer: str, failed: bool) -> str | None:
        """A panel's or jury's member's vote, as `check` takes a verdict (the answer the record judged): a panel
        member is a judge by name, a juror a whole judge the manifest records (its judge and its scoring)."""
        judge, by_probability = self.jurors.get(vote.rubric, ("", True)) if jury else (vote.rubric, None)
        if not judge:  # a juror the manifest does not list: VotesCheck refuses its record
            return None
        return self.check(judge, answer, failed, vote.raw, vote.parse_status, vote.score, vote.verdict, by_probability)


def verdict_problem(
    judge: str, reply: str | None, status: str, score: float | None, verdict: dict[str, Any] | None = None
) -> str | None:
    """Why a recorded verdict is not what its judge's recorded reply says (None: it is, as far as the read side can
    derive it: a shipped policy judge's reply is read again). `verdict`: the recorded verdict, where the record
    keeps one."""
    return _problem(score_rule(judge), judge, reply, status, score, verdict)


def _problem(
    rule: Reader | None,
    judge: str,
    reply: str | None,
    status: str,
    score: float | None,
    verdict: dict[str, Any] | None,
) -> str | None:
    if (status == "ok") != (score is not None):
        return f"parse_status is {status!r} with score {score!r} (only an ok verdict has a score)"
    if status == "error":
        return "parse_status is 'error' (the engine failed), and the judge's reply is recorded" if reply else None
    if rule is None:
        return None
    if reply is None:
        return f"judge_raw is missing: {judge} is a model judge and its reply is what the verdict is derived from"
    derived = rule.read(reply)
    if status != "ok":
        if derived is None:
            return None
        return f"parse_status is {status!r}, and the judge's reply reads as a verdict (score {derived.score})"
    if derived is None:
        return f"parse_status is 'ok', and the judge's reply does not read as a verdict of {judge}"
    if derived.score != score:
        return f"score is {score}, and the judge's reply reads {derived.score} ({judge})"
    if verdict is not None and verdict != derived.verdict:
        return "verdict is not the judge's reply as it parses"
    return None


def failed(record: ResultRecord) -> bool:
    """Whether the target gave no answer to judge (its turn, or an earlier one, could not be generated): what the
    judge step records as an engine error with an empty answer."""
    return record.error is not None and not record.answer and record.finish_reason in (None, "error")


def _derived_problem(
    judge: str, answer: str, failed: bool, status: str, score: float | None, verdict: dict[str, Any] | None
) -> str | None:
    """Why a model-free judge's recorded verdict is not what it derives from the answer (`runs.model_free`)."""
    if (status == "ok") != (score is not None):
        return f"parse_status is {status!r} with score {score!r} (only an ok verdict has a score)"
    if status == "error":  # unjudged only where there was no answer to judge: the judge itself cannot fail
        return None if failed else f"parse_status is 'error', and the target's answer is recorded: {judge} judges it"
    derive = model_free(judge)
    assert derive is not None  # the caller asked
    derived, value = derive(answer)
    if status != "ok":
        return f"parse_status is {status!r}, and {judge} derives a verdict from the answer (score {value})"
    if score != value:
        return f"score is {score}, and {judge} derives {value} from the answer"
    if verdict is not None and verdict != derived:
        return f"verdict is not what {judge} derives from the answer"
    return None


EDITED = "not what the run recorded (the record was edited)"
MIXED = (
    "a merged run holding another judge's verdicts (runs judged by different judges merged with merge "
    "--allow-different-judges, where no record was edited): verdicts of different judges do not mean the same, and "
    "the gate decides on no mix of judges"
)


class Rederived:
    """Each result, as `verify` streams it, against its item in the run's dataset and its recorded reply (an attack
    step, `items=False`: against its reply only, its turn being the attack's): the first record that disagrees is
    named (file, line, field), the others counted."""

    def __init__(self, manifest: Manifest, file: str, items: bool = True) -> None:
        self.file = file
        # each item's (benign, category, last judged turn): what its results' fields are derived from (none for an
        # attack's steps)
        self.items = (
            {item.id: (item.benign, item.category or "", max(item.turns)) for item in manifest.dataset.items or []}
            if items
            else {}
        )
        judge = manifest.judge
        self.judges = {False: judge.rubric, True: judge.benign_rubric} if judge else {}
        self.replies = Replies(manifest)
        self.merged = manifest.merged_from is not None
        self.first: dict[str, str] = {}  # by why it is wrong (`EDITED`, `MIXED`): the first record's line, problem
        self.count: Counter[str] = Counter()

    def see(self, line: Line[ResultRecord]) -> None:
        record = line.record
        problem = self._item_problem(record)  # first: an edited `benign` makes the judge look another's too
        other = None if problem else self._other_judge(record)
        problem = problem or other or self._problem(record)
        if problem is not None:
            why = MIXED if other and self.merged else EDITED
            self.count[why] += 1
            self.first.setdefault(why, f"{self.file} line {line.number}: {problem}")

    def _other_judge(self, record: ResultRecord) -> str | None:
        """Why the record is another judge's than the run's of its kind of item (None: it is not): which judge gave
        a verdict decides how it is read again, so a merge of runs of other judges (merge --allow-different-judges)
        is refused for it too."""
        expected = self.judges.get(record.benign)
        if expected is not None and record.judge_rubric != expected and not is_combined(expected):
            return f"judge_rubric is {record.judge_rubric!r}, the run's judge of these items is {expected!r}"
        return None

    def _item_problem(self, record: ResultRecord) -> str | None:
        item = self.items.get(record.item_id)
        if item is not None:  # an item the dataset does not have: refused by the coverage check
            benign, category, last = item
            derived = (benign, category, record.turn == last)
            if (record.benign, record.category, record.final_turn) != derived:
                for field, value in zip(("benign", "category", "final_turn"), derived):
                    if getattr(record, field) != value:
                        return f"{field} is {getattr(record, field)!r}, the run's dataset says {value!r}"
        return None

    def _problem(self, record: ResultRecord) -> str | None:
        if is_combined(record.judge_rubric):  # its score is its members' votes combined (runs.jury)
            jury = record.judge_rubric.startswith("jury:")
            for vote in record.panel or []:
                problem = self.replies.vote_problem(jury, vote, record.answer, failed(record))
                if problem is not None:
                    return f"panel: {vote.rubric}'s vote: {problem}"
            return None
        return self.replies.check(
            record.judge_rubric,
            record.answer,
            failed(record),
            record.judge_raw,
            record.parse_status,
            record.score,
            record.verdict,
        )

    def problems(self) -> list[str]:
        more = {why: f" (and {n - 1} more records)" if n > 1 else "" for why, n in self.count.items()}
        return [f"{first}{more[why]}: {why}" for why, first in self.first.items()]
