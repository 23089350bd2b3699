"""The docs site builds strictly (no broken link or anchor) with README as its front page and a reference
generated from the code; the runnable examples run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import REPO
from test_adversarial import finished_run
from test_series import scripted  # noqa: F401  (a fixture: every engine the pipeline makes is scripted)


def test_the_docs_site_builds_strictly_with_readme_first_and_a_generated_reference(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    front = (site / "index.html").read_text()
    assert "Two commands" in front and "What the gate verifies" in front  # README is the front page
    config = (site / "reference" / "config" / "index.html").read_text()
    for key in ("judge.rubric", "gate.max_asr", "attack.depth", "attack.max_backtracks", "placement.mode"):
        assert key in config, key  # every strategy's own knobs among them
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "--max-asr-increase" in cli and "diagsafe-local gate" in cli
    records = (site / "reference" / "run-directory" / "index.html").read_text()
    assert "judge_key" in records and "query_budget" in records


def test_the_example_that_gates_from_python(tmp_path, monkeypatch):
    run = finished_run(tmp_path, monkeypatch)
    example = [sys.executable, str(REPO / "examples" / "gate_from_python.py"), str(run)]
    passed = subprocess.run([*example, "--max-asr", "1", "--allow-degenerate-judge"], capture_output=True, text=True)
    assert passed.returncode == 0 and "GATE PASSED" in passed.stdout, passed.stderr
    failed = subprocess.run([*example, "--max-asr", "0.1", "--allow-degenerate-judge"], capture_output=True, text=True)
    assert failed.returncode == 1 and "FAIL  t: ASR 0.500" in failed.stdout
    (run / "summary.json").write_text("{}")
    refused = subprocess.run(example, capture_output=True, text=True)
    assert refused.returncode == 3 and "refused" in refused.stderr


def test_the_example_of_a_policy_judge():
    done = subprocess.run([sys.executable, str(REPO / "examples" / "policy_judge.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "s\u200beverity: none" in done.stdout  # the answer's fake verdict line reached the judge neutralised
    assert '"enum"' in done.stdout and "status ok, score 1.0" in done.stdout


def test_every_example_is_run_by_a_test():
    examples = {p.name for p in (REPO / "examples").glob("*.py")}
    tested = Path(__file__).read_text()
    assert examples and all(name in tested for name in examples), examples


def test_the_example_that_reads_a_series_and_gates_its_latest_checkpoint(tmp_path, scripted):  # noqa: F811
    from test_series import checkpoint, series_config, watch

    series_config(tmp_path)
    for step in (20, 160):
        checkpoint(tmp_path / "train", f"checkpoint-{step}")
    assert watch(tmp_path).exit_code == 0
    example = [
        sys.executable,
        str(REPO / "examples" / "series_from_python.py"),
        str(tmp_path / "train" / "safety-series"),
    ]
    done = subprocess.run([*example, "--max-asr", "0.5", "--allow-degenerate-judge"], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr  # the latest checkpoint complies with everything
    assert "step      160  ASR 100.0% [" in done.stdout and "+87.5% vs checkpoint-20" in done.stdout
    assert "first regression beyond 2%: step 160" in done.stdout and "GATE FAILED" in done.stdout


def _command_rows(output: str) -> dict[str, list[str]]:
    """The rows of the top-level help's command panel, by command: the help text of each row it spans."""
    panel = output[output.index("─ Commands ") :].splitlines()[1:]
    rows: dict[str, list[str]] = {}
    for line in panel:
        if line.startswith("╰"):
            break
        cells = line.strip("│ ").split(None, 1)
        if not line.startswith("│  ") and cells:  # a command's first row: its name, then its help
            rows[cells[0]] = [cells[1] if len(cells) > 1 else ""]
        else:
            rows[list(rows)[-1]].append(line.strip("│ "))
    return rows


def test_the_top_level_help_gives_each_command_one_line_its_first_sentence(monkeypatch):
    import typer.rich_utils
    from typer.main import get_command
    from typer.testing import CliRunner

    from diagsafe_local.cli import COMMANDS, app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    whole = {name: " ".join((commands[name].help or "").split()) for name in COMMANDS}
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 40 + max(map(len, whole.values())))  # room for any of them
    rows = _command_rows(CliRunner().invoke(app, ["--help"]).output)
    assert set(rows) == set(COMMANDS)
    for name, lines in rows.items():
        assert len(lines) == 1, (name, lines)  # one line, however long the command's own help
        line = lines[0]
        assert whole[name].startswith(line) and line.endswith((".", "?")), (name, line)
        rest = whole[name][len(line) :]
        assert rest == "" or rest.startswith(" "), (name, line)  # a whole sentence, not a cut word
        assert line.count("(") == line.count(")"), (name, line)
    assert len(rows["gate"][0]) < len(whole["gate"])  # the details stay in the command's own help
    own = " ".join(CliRunner().invoke(app, ["gate", "--help"]).output.replace("│", " ").split())
    assert "the run's config can only add stricter ones" in own


def test_every_module_a_docstring_or_comment_names_exists():
    """`runs.limits`, `commands.common.fire_hooks`: a name written in backticks in the package resolves to a module
    (and attribute) that exists, so a docstring cannot keep pointing at a module that was moved or removed."""
    import importlib
    import re

    package = REPO / "diagsafe_local"
    tops = "|".join(sorted(p.stem for p in package.iterdir() if p.suffix == ".py" or any(p.glob("*.py"))))
    named = re.compile(rf"`((?:diagsafe_local\.)?(?:{tops})(?:\.\w+)+)`")

    def resolves(name: str) -> bool:
        parts = name.removeprefix("diagsafe_local.").split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module("diagsafe_local." + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[cut:]:
                if not hasattr(found, attribute):
                    return False
                found = getattr(found, attribute)
            return True
        return False

    files = (".json", ".jsonl", ".yaml", ".md", ".py", ".csv", ".html", ".log")  # `validation.json` is a file
    stale = [
        f"{path.relative_to(REPO)}: `{name}`"
        for path in sorted(package.rglob("*.py"))
        for name in named.findall(path.read_text())
        if not name.endswith(files) and not resolves(name)
    ]
    assert not stale, stale


def test_every_field_of_the_run_directory_records_has_a_meaning_in_the_reference():
    """The generated run-directory reference takes each field's meaning from its `Field(description=...)`: every
    field of every record and section it shows (results, generations, controls, summary, manifest) has one."""
    sys.path.insert(0, str(REPO / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(REPO / "docs"))

    page = hooks._run_directory()
    rows = [row for row in page.splitlines() if row.startswith("| `")]
    empty = [row.split("`")[1] for row in rows if row.rstrip().endswith("|  |")]
    assert len(rows) > 300 and not empty, empty


def test_the_gate_page_links_the_generated_command_reference_and_names_only_real_options():
    """docs/gate.md lists no command's options by hand (a hand list missed six of the gate's): it links the
    reference generated from the command line, and every option it does name exists."""
    import re

    from typer.main import get_command

    from diagsafe_local.cli import app

    page = (REPO / "docs" / "gate.md").read_text()
    assert "(reference/cli.md#diagsafe-local-gate)" in page
    assert "[--" not in page  # no synopsis such as `gate RUN_DIR [--max-asr X] ...`

    def options(command: object) -> set[str]:
        inner = getattr(command, "commands", {})
        return {o for p in getattr(command, "params", []) for o in [*p.opts, *p.secondary_opts]}.union(
            *(options(c) for c in inner.values())
        )

    scripts = " ".join(path.read_text() for path in (REPO / "scripts").glob("*.py"))  # `--model DIR` of a script
    real = options(get_command(app)) | {"--help"} | set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", scripts))
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", page))
    assert named and named <= real, sorted(named - real)
