"""The adaptive attack's part of the report: its figures per target, the success-vs-queries curve, and the best
attack on each broken goal (hostile text: the caller fences it in Markdown and escapes it in HTML)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from diagsafe_local.core.console import percent as _pct
from diagsafe_local.core.figures import png_figure
from diagsafe_local.runs.manifest import AttackRef
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summary import AttackSummary, Summary

Section = tuple[str, list[str], list[list[str]], list[str]]


def attack_sections(summary: Summary) -> list[Section]:
    """The attack's tables (none when the run has no attack)."""
    attacked = {name: s.attack for name, s in summary.targets.items() if s.attack is not None}
    if not attacked:
        return []
    rows = []
    for name, a in attacked.items():
        rate = a.attack_success_rate
        rows.append(
            [
                name,
                a.strategy,
                f"{a.n_broken}/{a.n_goals}",
                f"{_pct(rate.rate)} [{_pct(rate.ci_low)}, {_pct(rate.ci_high)}]",
                str(a.n_queries),
                "n/a" if a.queries_to_success_median is None else f"{a.queries_to_success_median:g}",
                str(a.n_errors),
            ]
        )
    notes = [
        "A goal (a harmful item's request) is broken when any of its chains gets an answer the judge scores at or "
        "above the success threshold; it counts once. Queries are target queries over all the goal's chains "
        "until its first break. These figures measure the checkpoint against this attacker model and budget: a "
        "stronger attacker, or more queries, breaks more."
    ]
    queries = sorted({int(q) for a in attacked.values() for q in a.queries_to_success})
    curve = [
        [
            str(q),
            *(_pct(a.broken_within(q) if a.n_goals else None) for a in attacked.values()),
        ]
        for q in queries
    ]
    return [
        (
            "Adaptive attack",
            ["target", "strategy", "broken", "attack success rate", "queries", "median queries to break", "errors"],
            rows,
            notes,
        ),
        (
            "Attack success vs queries",
            ["queries", *attacked],
            curve,
            [] if curve else ["No goal was broken."],
        ),
    ]


def best_attacks(attacks: Iterable[ResultRecord], attack: AttackRef) -> list[tuple[str, str, str, str]]:
    """(heading, goal, attacker prompt, answer) of the best step on each broken goal: its highest score, then
    its earliest step."""
    wins: dict[tuple[str, str], ResultRecord] = {}
    for r in attacks:
        if r.attack is None or not attack.breaks(r.score, r.error):
            continue
        key = (r.target, r.item_id)
        best = wins.get(key)
        if best is None or (-r.score, r.turn, r.sample) < (-best.score, best.turn, best.sample):  # type: ignore[operator]
            wins[key] = r
    out = []
    for (target, item_id), r in sorted(wins.items()):
        info = r.attack
        assert info is not None
        head = (
            f"{target}, goal {item_id} ({r.category or 'no category'}): score {r.score:.2f} at stream {info.stream}, "
            f"step {info.step} (depth {info.depth}, turn {info.turn})"
        )
        out.append((head, info.goal, info.attacker_prompt, r.answer))
    return out


def attacked(summary: Summary) -> dict[str, AttackSummary]:
    """The targets whose attack had goals (none: the run draws no attack curve)."""
    return {name: s.attack for name, s in summary.targets.items() if s.attack is not None and s.attack.n_goals}


def attack_chart(summary: Summary, path: Path) -> None:
    """The success-vs-queries curve of every attacked target, as a PNG."""
    with png_figure(path, (6, 4)) as ax:
        for name, a in attacked(summary).items():
            xs = list(range(a.query_budget + 1))
            ax.step(xs, [a.broken_within(x) for x in xs], where="post", label=f"{name} ({a.strategy})")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("target queries per goal")
        ax.set_ylabel("goals broken")
        ax.set_title("Attack success vs queries")
        ax.legend(fontsize=8)
