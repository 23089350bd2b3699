"""Gate a finished run from Python, as `diagsafe-local gate` does: verify it, decide, print why.

    python examples/gate_from_python.py runs/step-12000 --max-asr 0.05

Exit 0 when the gate passes, 1 when it fails, 3 when the run does not verify (the command line's codes).
"""

import argparse
import sys

import diagsafe_local as ds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--max-asr", type=float, default=0.05)
    parser.add_argument("--allow-degenerate-judge", action="store_true")
    args = parser.parse_args()
    try:
        decision = ds.gate(args.run_dir, max_asr=args.max_asr, allow_degenerate_judge=args.allow_degenerate_judge)
    except ds.RunFailed as exc:  # the run (or its baseline) does not verify: nothing was decided
        print(f"refused: {exc}", file=sys.stderr)
        return 3
    print("\n".join(decision.lines))
    print("GATE PASSED" if decision.passed else "GATE FAILED")
    return 0 if decision.passed else 1


if __name__ == "__main__":
    sys.exit(main())
