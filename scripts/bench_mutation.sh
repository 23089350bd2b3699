#!/usr/bin/env bash
# Mutation figure (issue 43, "Tests that see what they claim"): mutmut over the gate's read side -- verify, gate,
# limits, the pass table and the pass modules -- with the fast tests that cover them. A benchmark, not a test: it
# takes hours on 2 cores, and its figure goes to docs/benchmarks-log.md.
#
# It runs on a snapshot of HEAD (a git worktree), never in the checkout: mutmut copies the sources into mutants/ and
# writes its own config there, so edits in the checkout go on undisturbed.
#
# Run:  scripts/bench_mutation.sh [WORKTREE]      (default /tmp/diagsafe-mutation; reuses it, resuming mutmut's run)
# Then: cd WORKTREE && mutmut results              (each survivor: mutmut show NAME)
# Needs mutmut in the virtualenv (.venv/bin/pip install mutmut; measured with 3.8.1).
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=${1:-/tmp/diagsafe-mutation}
venv=${VENV:-$repo/.venv}
children=${MUTMUT_CHILDREN:-2}

[[ -x $venv/bin/mutmut ]] || { echo "mutmut is not installed in $venv: $venv/bin/pip install mutmut" >&2; exit 2; }
[[ -d $work ]] || git -C "$repo" worktree add --detach "$work" HEAD
cd "$work"

# The modules measured, and the fast tests (not slow, no vLLM, no real model) that exercise them. The fuzzers and
# the jury's validate test are left out: each mutant reruns the tests that reach it, and those take a minute each.
# pyproject.toml has no [tool.mutmut], so mutmut reads setup.cfg (the snapshot's, never committed).
cat > setup.cfg <<'EOF'
[mutmut]
source_paths = diagsafe_local
also_copy =
    data
    configs
    examples
only_mutate =
    diagsafe_local/runs/verify.py
    diagsafe_local/runs/gate.py
    diagsafe_local/runs/limits.py
    diagsafe_local/runs/passes.py
    diagsafe_local/runs/controls.py
    diagsafe_local/runs/sensitivity.py
    diagsafe_local/runs/jury.py
    diagsafe_local/runs/robustness.py
    diagsafe_local/runs/injection.py
    diagsafe_local/runs/cascade.py
pytest_add_cli_args =
    -m
    not slow and not vllm and not real
    -p
    no:cacheprovider
    -W
    ignore
pytest_add_cli_args_test_selection =
    tests/test_trust_gate.py
    tests/test_trust_passes.py
    tests/test_pass_table.py
    tests/test_judging_passes.py
    tests/test_sensitivity.py
    tests/test_grammar_canary.py
    tests/test_adversarial_gate.py
    tests/test_policy.py
    tests/test_attestation.py
    tests/test_jury.py
    tests/test_limit_rows.py
    tests/test_verify_reads.py
    tests/test_verify_mutants.py
    tests/test_robustness.py
    tests/test_cascade.py
    tests/test_injection_canary.py
    tests/test_adv3_passes.py
    tests/test_canary_rides.py
    tests/test_pass_stores.py
    tests/test_pass_mutants.py
    --deselect=tests/test_jury.py::test_validate_measures_each_member_and_the_jury_as_one_judge_which_a_run_then_uses
EOF

export PATH=$venv/bin:$PATH
# Every mutant of these modules is ~3,700, each rerunning the tests that reach it: about 15 hours on 2 cores. So a
# seeded sample of each module's mutants (SAMPLE=30 of verify, gate and limits; PASS_SAMPLE of each other module,
# default a third of SAMPLE; SAMPLE=all: every one), of the modules named in MODULES (e.g. MODULES="gate jury";
# default all). mutmut keeps each result in mutants/, so a rerun resumes.
# MUTANTS=FILE: run the mutants named in FILE instead (e.g. an earlier sample's survivors, once tests were added).
# mutmut reruns every mutant named, checked or not: to resume a stopped sample, name only those not checked yet.
sample=${SAMPLE:-30}
seed=${SEED:-43}
export PASS_SAMPLE MODULES
if [[ -n ${MUTANTS:-} ]]; then
    [[ -f mutants/mutmut-stats.json ]] || nice mutmut run --max-children "$children" "diagsafe_local.runs.passes.x_named__mutmut_1"
    cp "$MUTANTS" mutation-sample.txt
    nice mutmut run --max-children "$children" $(cat mutation-sample.txt)
elif [[ $sample == all ]]; then
    nice mutmut run --max-children "$children"
else
    # generate the mutants and the test-to-function stats once (one mutant run; the sample follows)
    [[ -f mutants/mutmut-stats.json ]] || nice mutmut run --max-children "$children" "diagsafe_local.runs.passes.x_named__mutmut_1"
    mutmut results --all true > mutation-all.txt
    python - "$sample" "$seed" > mutation-sample.txt <<'EOF'
import collections, os, random, re, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
minor = int(os.environ.get("PASS_SAMPLE") or max(1, n // 3))
wanted = {f"diagsafe_local.runs.{m}" for m in os.environ.get("MODULES", "").split()}
by_module = collections.defaultdict(list)
for line in open("mutation-all.txt"):
    m = re.match(r"\s*((diagsafe_local\.runs\.\w+)\.\S+):", line)
    if m:
        by_module[m[2]].append(m[1])
major = {"diagsafe_local.runs.verify", "diagsafe_local.runs.gate", "diagsafe_local.runs.limits"}
for module, names in sorted(by_module.items()):
    if wanted and module not in wanted:
        continue
    k = min(len(names), n if module in major else minor)
    print("\n".join(random.Random(f"{seed}:{module}").sample(sorted(names), k)))
EOF
    nice mutmut run --max-children "$children" $(cat mutation-sample.txt)
fi
mutmut results --all true > mutation-results.txt || true
# Killed share per module, of the mutants run: every mutant's name starts with its module's dotted path.
python - <<'EOF'
import collections, os, re
chosen = set(open("mutation-sample.txt").read().split()) if os.path.exists("mutation-sample.txt") else None
counts = collections.defaultdict(collections.Counter)
for line in open("mutation-results.txt"):
    m = re.match(r"\s*((diagsafe_local\.runs\.\w+)\.\S+): (.+)", line)
    if m and m[3].strip() != "not checked" and (chosen is None or m[1] in chosen):
        counts[m[2]][m[3].strip()] += 1
for module, c in sorted(counts.items()):
    total = sum(c.values())
    print(f"{module}: {c['killed']}/{total} killed ({100 * c['killed'] / total:.1f}%), {dict(c)}")
EOF
