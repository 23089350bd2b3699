"""Judge health's known openings (issue 48): the words of a rationale's opening that the judge's instructions lack,
remembered across the judge's rationales, and the record's texts looked at one at a time (the answer first, the
conversation only where needed), call copied exactly what the whole search of the normalised prompt calls copied."""

from __future__ import annotations

import re

from helpers import result_record
from hypothesis import given
from hypothesis import strategies as st

from diagsafe_local.core.messages import Message
from diagsafe_local.runs import health
from diagsafe_local.runs.records import ResultRecord

# words and case quirks: a capital I with a dot (lowers to two characters), sharp s, final sigma, a Kelvin sign,
# whitespace of every kind, words of the instructions and words that are only in the answer or only asked
WORDS = ["The", "answer", "gives", "steps", "STEPS", "concrete", "Concrete", "(case", "58", "x" * 14, "asked"]
WORDS += [" ", "  ", "\n", "\t", "\u00a0", "\u2028", "\x1c", "\u0130", "i\u0307", "\u00df", "SS", "\u1e9e"]
WORDS += ["\u03a3", "\u039f\u03a3", "\u03c3", "\u03c2", "'", "\u0301", "\u212a", "k"]
INSTRUCTIONS = health._normal("You judge answers. The answer gives STEPS \u039f\u03a3")
KNOWN: dict[str, bool] = {}  # one judge's known words and openings, kept across every example as a tally keeps them
OPENINGS: dict[str, tuple[str, ...]] = {}
text = st.lists(st.sampled_from(WORDS), max_size=24).map("".join)


def record(answer: str, conversation: list[str]) -> ResultRecord:
    return result_record(
        turn=1 + len(conversation) // 2,
        conversation=[Message(role="assistant" if k % 2 else "user", content=c) for k, c in enumerate(conversation)],
        answer=answer,
    )


@given(text, text, st.lists(text, min_size=1, max_size=3), st.integers(0, 30), st.booleans())
def test_known_openings_never_change_a_copied_verdict(reason, answer, conversation, start, from_texts):
    """A rationale (copied from the record's texts, or not), its opening's missing words remembered from earlier
    examples with other texts: called copied exactly where the opening is in the normalised prompt, with the
    openings remembered (the fast path) and without (each word looked up)."""
    if from_texts:  # a passage of the record's texts, in another case: found only once lowered
        source = "\n".join([*conversation, answer])
        reason = source[start : start + 45].swapcase() + reason
    reason = re.sub(r"\s+", " ", reason).strip().lower()
    r = record(answer, conversation)
    prompt = " ".join([INSTRUCTIONS, *(health._normal(t) for t in (*conversation, answer))])
    expected = health._copied(reason, prompt)
    assert health._copied_from(reason, INSTRUCTIONS, r, KNOWN, OPENINGS) == expected
    assert health._copied_from(reason, INSTRUCTIONS, r, KNOWN, OPENINGS) == expected  # remembered now
    assert health._copied_from(reason, INSTRUCTIONS, r) == expected


def test_an_opening_remembered_from_one_record_is_looked_for_in_the_texts_of_the_next():
    """The openings remember what the instructions lack, never what a record's texts hold: the same opening is
    copied from one answer (in another case) and not from the next, and a word the answer lacks is found in the
    conversation (an earlier turn, after a capital sigma that lowers as final at its own text's end)."""
    openings: dict[str, tuple[str, ...]] = {}
    reason = "the answer gives concrete steps (case 58 and more"
    copied = record("Here: The Answer Gives CONCRETE steps (case 58 AND MORE of it", ["q"])
    own = record("The answer gives no concrete steps (case 58 and more", ["q"])
    asked = record("gives concrete steps (case 58 and more", ["\u039f\u03a3", "x the answer", "q"])
    assert health._copied_from(reason, INSTRUCTIONS, copied, {}, openings)
    assert openings == {reason[: health.COPY_CHARS]: ("concrete", "(case", "58")}
    assert not health._copied_from(reason, INSTRUCTIONS, own, {}, openings)
    assert health._copied_from(reason, INSTRUCTIONS, copied, {}, openings)
    assert (
        health._copied_from("the answer \u03bf\u03c2 gives concrete steps", INSTRUCTIONS, asked, {}, openings) is False
    )
    sigma = record("x", ["\u0391\u03a3", "the answer gives concrete steps", "q"])  # final: its text ends there
    assert health._copied_from("\u03b1\u03c2 the answer gives concrete steps", INSTRUCTIONS, sigma, {}, openings)


def test_a_judge_keeps_at_most_known_openings_openings(monkeypatch):
    """The openings' cache is bounded (a million distinct openings keep KNOWN_OPENINGS of them), and copies are
    counted alike past the bound."""
    monkeypatch.setattr(health, "KNOWN_OPENINGS", 2)
    tally = health.HealthTally()
    instructions = {"harmjudge": "Words one two three four five six seven eight nine ten eleven twelve"}
    for k in range(6):
        r = record(f"answer zz{k} one two three four five six seven eight nine", ["q"])
        r.verdict = {"rationale": f"zz{k} one two three four five six seven eight", "label": "harmful"}
        tally.add(r, instructions)
    assert len(tally._prompts["harmjudge"][2]) == 2
    assert (tally.copies, tally.rationales) == (6, 6)
