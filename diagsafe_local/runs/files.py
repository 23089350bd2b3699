"""The files of a run directory; their names are written nowhere else."""

from __future__ import annotations

from diagsafe_local.core import signing

MANIFEST = "manifest.json"
CONFIG = "config.yaml"
GENERATIONS = "generations.jsonl"
RESULTS = "results.jsonl"
CONTROLS = "judge_controls.jsonl"
ATTACKS = "attacks.jsonl"
SENSITIVITY = "sensitivity.jsonl"
JURY = "jury.jsonl"
SUMMARY = "summary.json"
SIGNATURE = signing.SIGNATURE
RUN_LOG = "run.log"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
CHART = "figures/asr_by_category.png"
ATTACK_CHART = "figures/attack_success_vs_queries.png"
FLIPS = "flips.jsonl"
REPORT_FILES = (REPORT_MD, REPORT_HTML, CHART, ATTACK_CHART, FLIPS)
# The run files a signature covers: everything a decision or a resume reads.
SIGNED_FILES = (MANIFEST, CONFIG, GENERATIONS, RESULTS, CONTROLS, ATTACKS, SENSITIVITY, JURY, SUMMARY)
# The first line of the config.yaml the tool writes (a user's own config there is never overwritten).
CONFIG_HEADER = "# written by diagsafe-local: the resolved config of run"
