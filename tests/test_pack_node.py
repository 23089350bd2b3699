"""What a pack holds for the node beyond the config's paths (issue 47's remainder): `judge.validation: auto`
resolved when packing and read from the pack only; the files of a model a run loads (not the whole snapshot);
a pack checked once per node (a stamp the shard processes trust only for files whose stat has not changed)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import yaml
from test_pack import _pack, packable  # noqa: F401  (a fixture: a config whose parts can be packed)
from test_series import scripted  # noqa: F401  (a fixture: every engine the pipeline makes is scripted)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.runs.manifest import read_manifest_file

# -- judge.validation: auto ---------------------------------------------------------------------------------------


def _auto(config: Path) -> None:
    data = yaml.safe_load(config.read_text())
    data["judge"]["validation"] = "auto"
    config.write_text(yaml.safe_dump(data))


def _validate_the_judge(config: Path, tmp_path: Path) -> Path:
    """`validate` the config's own judge (scripted: 'Sure' is harmful) into the judge cache; returns the stored
    validation.json."""
    from fakes import ScriptedEngine

    from diagsafe_local.evaluation.config import load_config
    from diagsafe_local.judging.cards import auto_validation
    from diagsafe_local.validation.gold import load_gold
    from diagsafe_local.validation.validate import run_validate

    rows = [{"prompt": f"q{k}", "response": f"Sure, {k}" if k >= 4 else "plain", "label": 1} for k in range(20)]
    rows += [{"prompt": f"q{k}", "response": "Sure, no." if k < 24 else "no", "label": 0} for k in range(20, 40)]
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = load_config(config, []).judge
    run_validate(
        load_gold(str(gold), "jsonl"),
        tmp_path / "validated",
        [judge],
        bootstrap=50,
        engine_factory=lambda spec, **_: ScriptedEngine(model=spec.model),
    )
    stored = auto_validation(judge)
    assert stored is not None
    return stored / "validation.json"


@pytest.mark.slow  # validate's first import is ~5 s
def test_auto_validation_is_packed_and_the_run_reads_it_from_the_pack_not_the_cache(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
    scripted,  # noqa: F811
):
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache"))
    _auto(packable)
    stored = _validate_the_judge(packable, tmp_path)
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    (part,) = [p for p in lock.parts if p.kind == "validation"]
    assert part.reference == "auto" and part.origin == str(stored.parent) and part.path is not None
    assert (out / part.path).read_bytes() == stored.read_bytes()
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "node-cache"))  # the node's: empty
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.validation is not None
    assert Path(manifest.validation.directory) == (out / part.path).parent.resolve()
    assert manifest.validation.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["judge_validation"]["fpr_measured"] == pytest.approx(0.2)


@pytest.mark.slow  # validate's first import is ~5 s
def test_a_pack_made_when_the_cache_had_no_validation_records_it_and_the_run_says_so(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
    scripted,  # noqa: F811
    caplog,
):
    """The run goes on without validated rates, as `auto` does where nothing is stored, and never looks in the
    node's cache (which holds one by then)."""
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache"))
    _auto(packable)
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    (part,) = [p for p in lock.parts if p.kind == "validation"]
    assert part.reference == "auto" and part.path is None and "no validation stored" in part.origin
    _validate_the_judge(packable, tmp_path)  # stored after packing: not in the pack
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 0, result.output
    assert read_manifest_file(tmp_path / "run").validation is None
    said = " ".join(caplog.text.split())
    assert "judge.validation: auto" in said and f"the pack {out} holds none" in said


def test_a_pack_made_without_auto_is_refused_for_a_config_asking_auto(packable, tmp_path, scripted):  # noqa: F811
    out = tmp_path / "pack"
    _pack(packable, out)
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out), "--set", "judge.validation=auto"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "has no validation 'auto'" in message and f"diagsafe-local pack CONFIG --out {out}" in message


# -- one check per node --------------------------------------------------------------------------------------------


@pytest.fixture
def hashed(monkeypatch, tmp_path) -> list[int]:
    """The bytes `open_pack` hashes, file by file (the node's check records in a cache of this test's own)."""
    from diagsafe_local.core import pack
    from diagsafe_local.core.cache import file_sha256

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "node-cache"))
    counted: list[int] = []

    def counting(path: Path) -> str:
        counted.append(path.stat().st_size)
        return file_sha256(path)

    monkeypatch.setattr(pack, "file_sha256", counting)
    return counted


def test_a_pack_is_hashed_once_per_node_and_a_file_changed_after_the_check_is_still_caught(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
    hashed,
):
    """`run --shards N` opens the pack in the parent and in each of N shard processes: N + 1 full reads before.
    The first check records each file's stat; the others hash only a file whose stat differs."""
    from diagsafe_local.core import pack
    from diagsafe_local.core.errors import RunFailed

    out = tmp_path / "pack"
    lock = _pack(packable, out)
    size = sum(f.size for f in lock.files)
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)  # files packed a moment ago count as settled
    pack.open_pack(out)  # the parent
    assert sum(hashed) == size
    hashed.clear()
    for _ in range(4):  # four shard processes
        pack.open_pack(out)
    assert sum(hashed) == 0
    weights = next(f for f in lock.files if f.path.endswith("model.safetensors"))
    data = bytearray((out / weights.path).read_bytes())
    data[-1] ^= 1  # same size, one byte: a stat that differs (inode times), so the file is hashed again
    (out / weights.path).write_bytes(bytes(data))
    with pytest.raises(RunFailed, match=f"{out / weights.path}: its bytes are not the ones packed"):
        pack.open_pack(out)
    assert hashed == [weights.size]


def test_the_check_is_trusted_only_where_it_cannot_be_forged_or_raced(packable, tmp_path, monkeypatch, hashed):  # noqa: F811
    """A record others could have written (its folder writable by the group) is not read; a file changed less
    than the margin before its check is hashed again next time (a change within the same tick of the file
    system's clock leaves its times as they were)."""
    from diagsafe_local.core import pack

    out = tmp_path / "pack"
    lock = _pack(packable, out)
    size = sum(f.size for f in lock.files)
    pack.open_pack(out)
    pack.open_pack(out)
    assert sum(hashed) == 2 * size  # every file changed just now: none settled
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)
    pack.open_pack(out)
    hashed.clear()
    records = tmp_path / "node-cache" / "pack-checks"
    (record,) = records.rglob("*.json")
    record.parent.chmod(0o770)
    pack.open_pack(out)
    assert sum(hashed) == size
