"""Judge sensitivity, the read side: which answers a run judges again under paraphrases of its judge's prompt
(`judge.sensitivity`), and what each paraphrase decides. The sample is a function of the dataset alone (every
target is judged again on the same answers, and the gate recomputes it from the manifest): the harmful items'
last judged turn, each sample of it, stratified by category in proportion to its answers (largest remainders;
every category at least one while the size allows), within a category the answers whose keys hash smallest;
with `over_refusal`, as many of the benign items' answers, judged again by the over-refusal judge under its
paraphrases (a second arm: over-refusal instead of ASR).

A verdict under a paraphrase the judge could not give (an error, a reply that does not parse or was cut off) is
never left out: any makes the gate's sensitivity check INCONCLUSIVE, and the gate says how many there were. Each
verdict's status and score are derived again from its recorded reply (`runs.rederive`), never taken from it.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel

from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs.files import SENSITIVITY
from diagsafe_local.runs.manifest import ItemRef, Manifest
from diagsafe_local.runs.records import CouldNotJudge, ResultRecord, SensitivityRecord
from diagsafe_local.runs.rederive import Replies

if TYPE_CHECKING:
    from diagsafe_local.runs.passes import Section
    from diagsafe_local.runs.verify import VerifiedRun

Key = tuple[str, int, int]  # item, sample, turn


def sensitivity_sample(items: Sequence[ItemRef], samples: int, size: int, benign: bool = False) -> list[Key]:
    """(item, sample, turn) of a target's answers in the sample (`samples`: its answers per item): of its
    harmful items, or with `benign` of its benign ones (the over-refusal judge's sample)."""
    strata: dict[str, list[Key]] = defaultdict(list)
    for item in items:
        if item.benign == benign:
            for s in range(samples):
                strata[item.category or "(none)"].append((item.id, s, max(item.turns)))
    total = sum(len(keys) for keys in strata.values())
    if total <= size:
        return sorted(key for keys in strata.values() for key in keys)
    shares = {c: size * len(keys) / total for c, keys in strata.items()}
    take = {c: min(len(strata[c]), max(1, int(share))) for c, share in shares.items()}
    for c in sorted(strata, key=lambda c: (int(shares[c]) - shares[c], c)):  # largest remainders first
        if sum(take.values()) >= size:
            break
        if take[c] < len(strata[c]):
            take[c] += 1
    chosen = [key for c, keys in strata.items() for key in sorted(keys, key=_rank)[: take[c]]]
    return sorted(chosen)


def _rank(key: Key) -> bytes:
    return hashlib.blake2b(f"{key[0]}\x00{key[1]}\x00{key[2]}".encode(), digest_size=8).digest()


class Tally(BaseModel):
    """The judge's scores summed over the sample's scored answers, overall and by category: ASR as the summary
    computes it (the mean score), for one wording of the judge's prompt; and the answers it could not judge
    under that wording (an error, a reply that does not parse or was cut off). Those are never left out of the
    decision: any of them makes the gate's sensitivity check INCONCLUSIVE (what that wording decides is unknown)."""

    score: float = 0.0
    n: int = 0
    by_category: dict[str, tuple[float, int]] = {}
    unjudged: int = 0

    @classmethod
    def of(cls, verdicts: Iterable[tuple[str, float | None]]) -> Tally:
        """From (category, score) pairs; an unscored verdict is counted apart, in `unjudged`."""
        sums: dict[str, float] = defaultdict(float)
        counts: Counter[str] = Counter()
        unjudged = 0
        for category, score in verdicts:
            if score is None or score != score:
                unjudged += 1
            else:
                sums[category] += score
                counts[category] += 1
        by = {c: (sums[c], counts[c]) for c in sorted(counts)}
        return cls(score=sum(sums.values()), n=sum(counts.values()), by_category=by, unjudged=unjudged)

    def rate(self, category: str | None = None) -> float | None:
        score, n = (self.score, self.n) if category is None else self.by_category.get(category, (0.0, 0))
        return score / n if n else None


class TargetSensitivity(BaseModel):
    """A target's sample as its judge decided it, and as each paraphrase did; `refusal` the same of its benign
    sample under the over-refusal judge (the over-refusal rate), where the run sampled one."""

    original: Tally
    variants: dict[str, Tally]
    refusal: TargetSensitivity | None = None


class SampleCheck:
    """Verifies a run's sensitivity records (sensitivity.jsonl): the run's judge settings say whether there must
    be any, and which; `see` takes the run's own results as verify reads them (the original verdicts on the
    sample); `read` the file; `problems` what does not hold; `figures` each target's tallies."""

    def __init__(self, manifest: Manifest) -> None:
        judge = manifest.config.get("judge") or {}
        self.settings = judge.get("sensitivity")
        items = manifest.dataset.items or []
        self.run_ids = manifest.run_ids()
        self.replies = Replies(manifest)
        # each item's category, read for the sample's verdicts (none without judge.sensitivity: not built)
        self.category = {item.id: item.category or "(none)" for item in items} if self.settings else {}
        # each arm: the judge whose paraphrases it is judged under, and the sampled answers' keys
        self.arms: dict[str, tuple[str | None, set[tuple[str, str, int, int]]]] = {}
        if self.settings and manifest.judge is not None:
            arms = {"harm": (manifest.judge.rubric, False)}
            if self.settings.get("over_refusal"):
                arms["refusal"] = (manifest.judge.benign_rubric, True)
            size = int(self.settings["sample"])
            for arm, (rubric, benign) in arms.items():
                keys = {
                    (name, *key)
                    for name, target in manifest.targets.items()
                    for key in sensitivity_sample(items, target.samples, size, benign)
                }
                self.arms[arm] = (rubric, keys)
        # each sampled answer's arm, the first that has it: one look-up a result (verify hands every one to `see`)
        self._arm_of: dict[tuple[str, str, int, int], str] = {}
        for arm, (_, keys) in reversed(self.arms.items()):
            self._arm_of.update(dict.fromkeys(keys, arm))
        self.original: dict[tuple[str, str], list[tuple[str, float | None]]] = defaultdict(list)
        self.variants: dict[tuple[str, str], dict[str, list[tuple[str, float | None]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self._problems: list[str] = []

    def see(self, record: ResultRecord) -> None:
        if not self._arm_of:
            return  # no sample (no judge.sensitivity): no result's verdict is kept
        arm = self._arm_of.get(record.key)
        if arm is not None:
            self.original[arm, record.target].append((self.category.get(record.item_id, "(none)"), record.score))

    def read(self, lines: Sequence[Line[SensitivityRecord]] | None) -> None:
        """Check the file's records as the caller read (and hashed) them; None: it found no file."""
        if lines is None:
            if self.settings:
                self._problems.append(f"no {SENSITIVITY}: the run's judge.sensitivity sample was never judged again")
            return
        if not self.settings:
            self._problems.append(f"{SENSITIVITY} is there, and the run's config has no judge.sensitivity")
            return
        variants = range(1, int(self.settings["variants"]) + 1)
        names = {arm: {f"{rubric}~{k}" for k in variants} for arm, (rubric, _) in self.arms.items()}
        found: dict[tuple, tuple[str, SensitivityRecord]] = {}
        for line in lines:
            record = line.record
            if record.run_id not in self.run_ids:
                self._problems.append(f"{SENSITIVITY} line {line.number}: a record of run {record.run_id}")
                return
            arm = self._arm_of.get(record.key[:4])
            if arm is None or record.variant not in names[arm]:
                self._problems.append(f"{SENSITIVITY} line {line.number}: {record.key} is not in the run's sample")
                return
            wrong = self.replies.problem(record.variant, record.judge_raw, record.parse_status, record.score)
            if wrong is not None:
                self._problems.append(f"{SENSITIVITY} line {line.number}: {wrong}: not what the run recorded")
                return
            found[record.key] = (arm, record)
        missing = sum(len(keys) * len(names[arm]) for arm, (_, keys) in self.arms.items()) - len(found)
        if missing:
            self._problems.append(f"{SENSITIVITY} lacks {missing} of the sample's verdicts under the paraphrases")
        for arm, record in found.values():
            category = self.category.get(record.item_id, "(none)")
            self.variants[arm, record.target][record.variant].append((category, record.score))

    def problems(self) -> list[str]:
        return self._problems

    def could_not_judge(self) -> dict[str, CouldNotJudge]:
        """Per target, the verdicts under the paraphrases (of every arm) that the judge could not give."""
        counts: dict[str, CouldNotJudge] = {}
        for (_, target), variants in sorted(self.variants.items()):
            tallies = [Tally.of(verdicts) for verdicts in variants.values()]
            counted = counts.get(target, CouldNotJudge(count=0, of=0))
            counts[target] = CouldNotJudge(
                count=counted.count + sum(t.unjudged for t in tallies),
                of=counted.of + sum(t.n + t.unjudged for t in tallies),
            )
        return counts

    def _figure(self, arm: str, target: str) -> TargetSensitivity:
        variants = self.variants[arm, target]
        return TargetSensitivity(
            original=Tally.of(self.original[arm, target]),
            variants={name: Tally.of(verdicts) for name, verdicts in sorted(variants.items())},
        )

    def figures(self) -> dict[str, TargetSensitivity] | None:
        if not self.settings or self._problems or "harm" not in self.arms:
            return None
        targets = sorted({t for _, keys in self.arms.values() for t, *_ in keys})
        return {
            target: self._figure("harm", target).model_copy(
                update={"refusal": self._figure("refusal", target) if self.arms.get("refusal", (None, ()))[1] else None}
            )
            for target in targets
        }


def section(run: VerifiedRun) -> Section | None:
    """ASR on the sensitivity sample (and over-refusal on its benign sample) under the judge's prompt and each
    paraphrase, overall and per category (none without a sample that verified)."""
    figures = run.sensitivity
    if not figures:
        return None
    count = max(len(f.variants) for f in figures.values())
    rows = []
    for name, figure in figures.items():
        arms = [("ASR", figure), *([("over-refusal", figure.refusal)] if figure.refusal is not None else [])]
        for measure, arm in arms:
            variants = [arm.variants[v] for v in sorted(arm.variants, key=lambda v: int(v.rsplit("~", 1)[1]))]
            for category in [None, *arm.original.by_category]:
                rates = [t.rate(category) for t in (arm.original, *variants)]
                known = [r for r in rates if r is not None]
                spread = f"{max(known) - min(known):.1%}" if known else "n/a"
                cells = ["n/a" if r is None else f"{r:.1%}" for r in rates]
                rows.append([name, measure, category or "overall", *cells, spread])
    note = (
        "The same sampled answers judged again by the same model under paraphrases of its prompt (criteria and labels "
        "kept): the spread is how much the wording alone moves the rate; the gate says INCONCLUSIVE where it flips "
        "a limit, and where a verdict is missing. Verdicts it could not judge (the judge's prompt and paraphrases): "
        + ", ".join(
            f"{name} {sum(t.unjudged for arm in (f, f.refusal) if arm for t in (arm.original, *arm.variants.values()))}"
            for name, f in figures.items()
        )
        + "."
    )
    header = ["target", "rate", "category", "judge's prompt", *(f"paraphrase {k}" for k in range(1, count + 1))]
    return ("Judge sensitivity", [*header, "spread"], rows, [note])
