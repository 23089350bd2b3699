"""Read a training run's safety series from Python and gate its latest checkpoint, as `report SERIES_DIR` and
`gate SERIES_DIR --checkpoint latest` do.

    python examples/series_from_python.py ckpts/safety-series --max-asr 0.05

Prints each checkpoint's ASR with its 95% interval and its paired change from the previous one, the first
regression beyond the margin, and the gate's decision on the latest checkpoint. Exit 0 when the gate passes, 1
when it fails, 3 when the latest checkpoint has no run that verifies (the command line's codes).
"""

import argparse
import sys

import diagsafe_local as ds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("series_dir")
    parser.add_argument("--max-asr", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=0.02)
    parser.add_argument("--allow-degenerate-judge", action="store_true")
    args = parser.parse_args()
    series = ds.series_report(args.series_dir, margin=args.margin)
    for point in series.points:
        if point.asr is None:
            print(f"step {point.step:>8}  {point.status}")
            continue
        change = point.vs_previous
        delta = f"  {change.diff:+.1%} vs {change.against}" if change and change.diff is not None else ""
        print(
            f"step {point.step:>8}  ASR {point.asr.value:.1%} [{point.asr.ci_low:.1%}, {point.asr.ci_high:.1%}]{delta}"
        )
    first = series.first_regression
    print(f"first regression beyond {args.margin:.0%}: " + (f"step {first.step}" if first else "none"))
    try:
        decision = ds.gate(
            args.series_dir,
            checkpoint="latest",
            max_asr=args.max_asr,
            allow_degenerate_judge=args.allow_degenerate_judge,
        )
    except ds.RunFailed as exc:  # the latest checkpoint has no run that verifies: nothing was decided
        print(f"refused: {exc}", file=sys.stderr)
        return 3
    print("\n".join(decision.lines))
    print("GATE PASSED" if decision.passed else "GATE FAILED")
    return 0 if decision.passed else 1


if __name__ == "__main__":
    sys.exit(main())
