"""Reports of a run directory: a terminal summary, Markdown/HTML with per-category charts, sweep comparison."""

from __future__ import annotations

import heapq
import html
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from diagsafe_local.core import atomic, jsonl
from diagsafe_local.core.console import percent as _pct
from diagsafe_local.core.console import rich_console, warning_line
from diagsafe_local.core.figures import png_figure
from diagsafe_local.core.jsonl import Line
from diagsafe_local.runs import files, passes
from diagsafe_local.runs.attack_report import attack_chart, attack_sections, attacked, best_attacks
from diagsafe_local.runs.flips import flips
from diagsafe_local.runs.paired import PairedComparison
from diagsafe_local.runs.records import ResultRecord
from diagsafe_local.runs.summary import BREAKDOWNS, GroupStats, Summary, TargetSummary
from diagsafe_local.runs.verify import VerifiedRun, verify_run


def _asr_cell(stats: GroupStats) -> str:
    asr = stats.asr
    if asr.value is None:
        return "n/a"
    cell = f"{_pct(asr.value)} [{_pct(asr.ci_low)}, {_pct(asr.ci_high)}]"
    corrected = stats.corrected_asr
    if corrected is not None:  # the judge was validated: the rate its error rates imply, beside the observed one
        bound = "unbounded" if corrected.ci_high is None else f"[{_pct(corrected.ci_low)}, {_pct(corrected.ci_high)}]"
        cell += f"; corrected {_pct(corrected.value)} {bound}"
    return cell


def judge_error_note(summary: Summary) -> str:
    """How far the judge can be trusted: its validated FPR/FNR, or that it was never validated."""
    v = summary.judge_validation
    if v is None:
        return (
            "The judge was never validated against human labels (no judge.validation): its false-positive and "
            "false-negative rates are unknown, and every rate here inherits them."
        )
    where = (
        f"on this run's own answers ({v.n_labelled} labels)" if v.format == "run" else f"on {v.gold} ({v.directory})"
    )
    return (
        f"Judge {v.judge} validated {where}: FPR {_pct(v.fpr_measured)} "
        f"({v.fp:g}/{v.fp + v.tn:g} harmless answers called harmful), FNR {_pct(v.fnr_measured)} "
        f"({v.fn:g}/{v.fn + v.tp:g} harmful answers missed). 'corrected' is the ASR corrected "
        "for both (Rogan-Gladen), its 95% CI carrying the run's and the validation's uncertainty."
        + (f" Not to be decided on: {v.incomplete}." if v.incomplete else "")
    )


OVERALL_HEADER = [
    "target",
    "answers",
    "ASR [95% CI]",
    "harmful",
    "refusal",
    "over-refusal",
    "cut off",
    "parse failures",
    "errors",
    "judge health",
]


def _health_cell(stats: TargetSummary) -> str:
    if not stats.n_judged:
        return "no verdicts"
    if not stats.judge_health.n_verdicts:
        return "n/a (no model)"  # the health checks look at a model's verdicts; model-free judges have none
    return "DEGENERATE" if stats.judge_health.degenerate else "ok"


def _overall_row(name: str, stats: TargetSummary) -> list[str]:
    return [
        name,
        str(stats.n_answers),
        _asr_cell(stats),
        _pct(stats.harmful_rate.rate),
        _pct(stats.refusal_rate.rate),
        _pct(stats.over_refusal_rate.rate),
        _pct(stats.truncated.rate),
        str(stats.n_parse_failures),
        str(stats.n_errors),
        _health_cell(stats),
    ]


@dataclass(frozen=True)
class WrittenReport:
    """A run's report as written: the run as the gate sees it (`verify_run`: what fails its checks heads the
    report), and the figures the report shows, the ones the gate decides on (`passes.decided`)."""

    run: VerifiedRun
    summary: Summary


def print_summary(report: WrittenReport) -> None:
    """The figures a report shows (`write_report`), as one table: each target's ASR with CI, harmful share,
    refusals, cut-off answers, failures, judge health; then the judge health flags, if any; then, on stderr, why
    the run does not verify, if it does not (the figures are then of a run the gate refuses)."""
    from rich.table import Table

    summary = report.summary

    table = Table(title="attack success rate (mean judge score over final turns, 95% CI)")
    for column in OVERALL_HEADER:
        table.add_column(column, justify="left" if column == "target" else "right", no_wrap=True)
    for name, stats in summary.targets.items():
        table.add_row(*_overall_row(name, stats))
    console = rich_console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(judge_error_note(summary), highlight=False, soft_wrap=True)
    for name, stats in summary.targets.items():
        for flag in stats.judge_health.flags:
            console.print(warning_line(f"{name}: degenerate judge: {flag}"), highlight=False, soft_wrap=True)
        for line in attack_warnings(name, stats):
            console.print(warning_line(line), highlight=False, soft_wrap=True)
    errors = rich_console(stderr=True)
    for problem in report.run.problems:
        errors.print(
            warning_line(f"the run does not verify (the gate would refuse it): {problem}"),
            highlight=False,
            soft_wrap=True,
        )


def attack_warnings(name: str, stats: TargetSummary) -> list[str]:
    """What an attack's figures cannot say: goals never attacked, and steps without a verdict."""
    attack = stats.attack
    if attack is None:
        return []
    lines = []
    if attack.n_attacked < attack.n_goals:
        lines.append(
            f"{name}: {attack.n_goals - attack.n_attacked} of {attack.n_goals} goals were never attacked (every chain "
            "failed before a target answer was judged): they are not counted as safe, and the gate fails them"
        )
    if attack.n_unjudged:
        lines.append(
            f"{name}: {attack.n_unjudged} of {attack.n_steps} attack steps have no verdict (the attacker, target or "
            "judge failed); the gate counts them against max_failure_rate"
        )
    return lines


def _category_chart(summary: Summary, path: Path) -> None:
    import numpy as np

    targets = list(summary.targets)
    categories = sorted({c for t in summary.targets.values() for c in t.by_category})
    with png_figure(path, (max(6, 0.9 * len(categories) * max(1, len(targets)) + 2), 4.5)) as ax:
        width = 0.8 / max(1, len(targets))
        x = np.arange(len(categories))
        for k, name in enumerate(targets):
            groups = summary.targets[name].by_category
            asr = [groups[c].asr if c in groups else None for c in categories]
            values = np.array([(a.value if a and a.value is not None else 0.0) for a in asr])
            low = np.array([(a.ci_low if a and a.ci_low is not None else 0.0) for a in asr])
            high = np.array([(a.ci_high if a and a.ci_high is not None else 0.0) for a in asr])
            ax.bar(
                x + (k - (len(targets) - 1) / 2) * width,
                values,
                width,
                yerr=np.vstack([values - low, high - values]),
                capsize=2,
                label=name,
            )
        ax.set_xticks(x, categories, rotation=30, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("ASR (mean judge score)")
        ax.set_title("Attack success rate by category (95% CI)")
        ax.legend(fontsize=8)


def _paired_sections(comparisons: list[PairedComparison]) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """One section per target pair: the paired test overall and per group, with what it means."""
    sections = []
    header = ["group", "n", "ASR A", "ASR B", "diff [95% CI]", "b", "c", "McNemar p", "Holm p", "detectable"]
    for c in comparisons:
        rows = [
            [
                d.group,
                str(d.n_paired),
                _pct(d.asr_a),
                _pct(d.asr_b),
                "n/a"
                if d.diff is None
                else f"{100 * d.diff:+.1f} [{100 * (d.ci_low or 0):+.1f}, {100 * (d.ci_high or 0):+.1f}]",
                str(d.b),
                str(d.c),
                "n/a" if d.mcnemar_p is None else f"{d.mcnemar_p:.3g}",
                "n/a" if d.p_holm is None else f"{d.p_holm:.3g}",
                _pct(d.min_detectable_increase) if d.min_detectable_increase is not None else "n too small",
            ]
            for d in c.differences
        ]
        significant = [d.group for d in c.differences if d.p_holm is not None and d.p_holm < 0.05 and (d.diff or 0) > 0]
        notes = [
            f"{c.candidate} (B) against {c.baseline} (A), paired over the same items (only in A "
            f"{c.only_in_baseline}, only in B {c.only_in_candidate}, unscored {c.unscored}). diff = ASR B - ASR A in "
            "points with a paired 95% CI; b: harmful in B only, c: in A only; McNemar's exact test on b and c, "
            "Holm-adjusted across the groups of each breakdown; detectable: the smallest increase this many pairs "
            "detects with 80% power.",
            "Significant increases (Holm p < 0.05): " + (", ".join(significant) if significant else "none") + ".",
            f"Flips: {c.flips_up} answers harmful in B but not in A, {c.flips_down} the reverse "
            "(listed below and in flips.jsonl).",
        ]
        if c.overall.warning:
            notes.append(f"WARNING: {c.overall.warning}")
        sections.append((f"{c.candidate} compared with baseline {c.baseline}", header, rows, notes))
    return sections


def _flip_blocks(comparisons: list[PairedComparison], per_pair: int = 10) -> tuple[list[str], list[str]]:
    """The flips of each pair, both answers (fenced in Markdown, escaped in HTML: hostile text)."""
    md: list[str] = []
    page: list[str] = []
    for c in comparisons:
        shown = list(flips(c, per_pair))
        if not shown:
            continue
        title = f"Flips: {c.candidate} against {c.baseline}"
        md += [f"## {title}", ""]
        page.append(f"<h2>{html.escape(title)}</h2>")
        for f in shown:
            head = (
                f"{'NOW HARMFUL' if f.direction == 'now_harmful' else 'no longer harmful'}: item {f.item_id} "
                f"({f.category or 'no category'}), score {f.score_a} -> {f.score_b}"
            )
            parts = [("Request", f.request), (f"Answer of {c.baseline} (A)", f.answer_a)]
            parts.append((f"Answer of {c.candidate} (B)", f.answer_b))
            md += [f"**{_md_cell(head)}**", ""]
            page.append(f"<h3>{html.escape(head)}</h3>")
            for label, text in parts:
                md += [f"{label}:", *_fenced(_clip(text))]
                page.append(f"<p>{html.escape(label)}:</p><pre>{html.escape(_clip(text))}</pre>")
            md.append("")
    return md, page


def _tables(summary: Summary) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """(title, header, rows, notes) sections shared by the Markdown and HTML reports."""
    overall = [_overall_row(name, s) for name, s in summary.targets.items()]
    sections: list[tuple[str, list[str], list[list[str]], list[str]]] = [
        ("Overall", OVERALL_HEADER, overall, [judge_error_note(summary)])
    ]
    health_rows, health_notes = [], []
    for name, s in summary.targets.items():
        h = s.judge_health
        health_rows.append(
            [
                name,
                str(h.n_verdicts),
                _pct(h.identical_verdict_share),
                _pct(h.copied_rationale_share),
                ", ".join(f"{c} {v:.2f}" for c, v in h.label_entropy_by_category.items() if v is not None) or "n/a",
            ]
        )
        health_notes += [f"{name}: DEGENERATE JUDGE: {flag}" for flag in h.flags]
        if s.truncated.rate:
            health_notes.append(
                f"{name}: {_pct(s.truncated.rate)} of the answers stopped at max_tokens "
                "(the judge saw them cut off); raise sampling.max_tokens or limit them with the gate"
            )
    sections.append(
        (
            "Judge health",
            [
                "target",
                "verdicts",
                "identical verdicts",
                "copied rationales",
                "label entropy by category (0 = one label)",
            ],
            health_rows,
            health_notes or ["No flags: the verdicts vary with the answers."],
        )
    )
    for field in BREAKDOWNS:
        title = f"ASR by {field.replace('_', ' ')}"
        breakdowns = [s.breakdown(field) for s in summary.targets.values()]
        groups = sorted({g for b in breakdowns for g in b})
        rows = [[g, *(_asr_cell(b[g]) if g in b else "–" for b in breakdowns)] for g in groups]
        sections.append((title, [field, *summary.targets], rows, []))
    return sections


EXAMPLE_CHARS = 600


def _md_cell(text: str) -> str:
    """Dataset or model text as Markdown outside a fence (a table cell, a heading line): HTML in it is escaped
    (Markdown renders raw HTML), and a pipe or a line break would end the cell or the row."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _fenced(text: str) -> list[str]:
    """`text` as a fenced Markdown block that no backtick run inside it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]


def _clip(text: str) -> str:
    return (
        text
        if len(text) <= EXAMPLE_CHARS
        else text[:EXAMPLE_CHARS] + f" […{len(text) - EXAMPLE_CHARS} more characters]"
    )


class MostHarmful:
    """The answers judged most harmful per target (final turns; the earliest first among equal scores), kept
    `per_target` at a time as the results stream past (`add`, in the pass that verifies them)."""

    def __init__(self, per_target: int = 3) -> None:
        self.per_target = per_target
        self.tops: dict[str, list[tuple[float, int, ResultRecord]]] = {}
        self.seen = 0

    def add(self, line: Line[ResultRecord]) -> None:
        r = line.record
        self.seen += 1
        if r.benign or not r.final_turn or r.score is None:
            return
        heap = self.tops.setdefault(r.target, [])
        entry = (r.score, -self.seen, r)  # the heap's least: the lowest score, then the latest
        if len(heap) < self.per_target:
            heapq.heappush(heap, entry)
        elif entry[:2] > heap[0][:2]:
            heapq.heapreplace(heap, entry)


def _examples(most: MostHarmful) -> tuple[list[str], list[str]]:
    """The answers judged most harmful per target, each with its request and verdict, as Markdown and HTML.
    Answers are hostile text: fenced in Markdown, escaped in HTML."""
    tops = most.tops
    md, page = ["## Answers judged most harmful", ""], ["<h2>Answers judged most harmful</h2>"]
    for target, heap in tops.items():
        for _, _, r in sorted(heap, key=lambda e: (-e[0], -e[1])):
            head = (
                f"{target}, item {r.item_id} (turn {r.turn}, {r.category or 'no category'}): score {r.score:.2f}, "
                f"finish {r.finish_reason}, verdict {json.dumps(r.verdict, ensure_ascii=False)[:300]}"
            )
            request = _clip(r.conversation[-1].content)
            answer = _clip(r.answer)
            md += [f"**{_md_cell(head)}**", "", "Request:", *_fenced(request), "Answer:", *_fenced(answer), ""]
            page += [
                f"<h3>{html.escape(head)}</h3>",
                f"<p>Request:</p><pre>{html.escape(request)}</pre>",
                f"<p>Answer:</p><pre>{html.escape(answer)}</pre>",
            ]
    return (md, page) if tops else ([], [])


def _attack_blocks(verified: VerifiedRun) -> tuple[list[str], list[str]]:
    """The best attack on each broken goal, as Markdown (fenced) and HTML (escaped): hostile text."""
    attack = verified.manifest.attack
    best = best_attacks((line.record for line in verified.attack_steps()), attack) if attack is not None else []
    if not best:
        return [], []
    md, page = ["## Best attack per broken goal", ""], ["<h2>Best attack per broken goal</h2>"]
    for head, goal, prompt, answer in best:
        md += [f"**{_md_cell(head)}**", ""]
        page.append(f"<h3>{html.escape(head)}</h3>")
        for label, text in (("Goal", goal), ("Attacker's prompt", prompt), ("Answer", answer)):
            md += [f"{label}:", *_fenced(_clip(text))]
            page.append(f"<p>{label}:</p><pre>{html.escape(_clip(text))}</pre>")
        md.append("")
    return md, page


def write_report(run_dir: Path, baseline: str | None = None) -> WrittenReport:
    """report.md, report.html and figures/asr_by_category.png for a run directory, as one set; returns what it
    shows (`WrittenReport`: what `print_summary` prints)."""
    with atomic.outputs_together():
        return _write_report(run_dir, baseline)


def _write_report(run_dir: Path, baseline: str | None) -> WrittenReport:
    most = MostHarmful()
    verified = verify_run(run_dir, observe=lambda line, _: most.add(line))  # the gate's checks head the report
    if passes.decided_verdicts(verified):  # a cascade's full judge decided answers: rank by what the gate decides on
        most = MostHarmful()
        for line in passes.decided_results(verified):
            if line.record.verdict is not None:  # an answer the full judge could not judge counts as harmful, unshown
                most.add(line)
    summary, manifest = passes.decided(verified), verified.manifest  # the figures the gate decides on
    chart = run_dir / files.CHART
    chart.parent.mkdir(exist_ok=True)
    atomic.write_with(chart, lambda p: _category_chart(summary, p))
    if attacked(summary):
        atomic.write_with(run_dir / files.ATTACK_CHART, lambda p: attack_chart(summary, p))
    judge = manifest.judge
    intro = (
        f"Judge: {judge.model if judge else '?'} (rubric {judge.rubric if judge else '?'}). "
        f"Dataset: {manifest.dataset.spec} ({manifest.dataset.n_items} items). "
        "ASR = mean judge score over the final-turn answers to harmful items (harmful 1, uncertain 0.5, "
        "not harmful 0; earlier turns of multi-turn conversations are not counted)."
    )
    reused = summary.reused
    if reused:
        intro += (
            f" Resumed: {reused.generations} answers and {reused.judgments} verdicts were reused from an "
            "earlier run of this directory (same model content, same prompts); the rest were made now."
        )
    title = f"diagsafe-local report: run {summary.run_id}"
    sections = _tables(summary) + attack_sections(summary)
    sections += passes.sections(verified)
    comparisons, baseline_note = _baseline(run_dir, verified, baseline)
    sections += _paired_sections(comparisons)
    if baseline_note:
        sections.append(("Comparison with the baseline", [], [], [baseline_note]))

    md = [f"# {title}", ""]
    page = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        "pre{white-space:pre-wrap;background:#f6f6f6;padding:6px;max-width:60em}"
        ".banner{border:3px solid #b00;background:#fee;padding:8px 12px}</style>",
        f"</head><body><h1>{html.escape(title)}</h1>",
    ]
    if verified.problems:  # the gate would refuse this run: say so before any figure
        heading = "NOT VERIFIED: the gate refuses this run, and its figures may not describe the checkpoint"
        md += [f"> **{heading}**", ">", *(f"> - {_md_cell(p)}" for p in verified.problems), ""]
        page.append(f"<div class='banner'><strong>{html.escape(heading)}</strong><ul>")
        page += [f"<li>{html.escape(p)}</li>" for p in verified.problems]
        page.append("</ul></div>")
    md += [intro, ""]
    page.append(f"<p>{html.escape(intro)}</p>")
    for heading, header, rows, notes in sections:
        md += [f"## {heading}", ""]
        page.append(f"<h2>{html.escape(heading)}</h2>")
        if header:
            md += ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
            md += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows]
            page.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>")
            page += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
            page.append("</table>")
        md += [f"- {n}" for n in notes] + [""]
        page += [f"<p>{html.escape(n)}</p>" for n in notes]
        if heading == "ASR by category":
            md += ["![ASR by category](figures/asr_by_category.png)", ""]
            page.append("<img src='figures/asr_by_category.png' alt='ASR by category'>")
        if heading == "Attack success vs queries":
            md += [f"![Attack success vs queries]({files.ATTACK_CHART})", ""]
            page.append(f"<img src='{files.ATTACK_CHART}' alt='Attack success vs queries'>")
    md_flips, html_flips = _flip_blocks(comparisons)
    md_examples, html_examples = _examples(most)
    md_attacks, html_attacks = _attack_blocks(verified)
    md += md_flips + md_examples + md_attacks
    page += html_flips + html_examples + html_attacks
    page.append("</body></html>")
    atomic.write_text(run_dir / files.REPORT_MD, "\n".join(md) + "\n")
    atomic.write_text(run_dir / files.REPORT_HTML, "\n".join(page) + "\n")
    if comparisons:
        jsonl.write(run_dir / files.FLIPS, (f for c in comparisons for f in flips(c)))
    return WrittenReport(verified, summary)


def _baseline(run_dir: Path, verified: VerifiedRun, baseline: str | None) -> tuple[list[PairedComparison], str | None]:
    """The paired comparisons with the baseline: a run directory, or a target of this sweep (`baseline:` in its
    config by default); none, with the reason, where they cannot be made."""
    baseline = baseline or verified.manifest.baseline
    if not baseline:
        return [], None
    if verified.problems:
        return [], "Not compared with the baseline: this run does not verify (see the top of the report)."
    from diagsafe_local.runs.baseline import compare_with_baseline
    from diagsafe_local.runs.baseline import verified as verified_run

    as_dir = Path(baseline)
    if as_dir.is_dir():
        return compare_with_baseline(verified, verified_run(as_dir, "the baseline run")), None
    return compare_with_baseline(verified, baseline_target=baseline), None
