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
from diagsafe_local.core.pack import LOCK, PackLock
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
    The parent's check records each file's stat; the shards, handed its token, hash only a file whose stat differs
    (a later run hashes every file: tests/test_adv4_pack.py)."""
    from diagsafe_local.core import pack
    from diagsafe_local.core.errors import RunFailed

    out = tmp_path / "pack"
    lock = _pack(packable, out)
    size = sum(f.size for f in lock.files)
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)  # files packed a moment ago count as settled
    parent = pack.open_pack(out)
    assert sum(hashed) == size and parent.check is not None
    hashed.clear()
    monkeypatch.setenv(pack.CHECK_ENV, parent.check)
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
    first = pack.open_pack(out)
    assert first.check is not None
    monkeypatch.setenv(pack.CHECK_ENV, first.check)
    pack.open_pack(out)
    assert sum(hashed) == 2 * size  # every file changed just now: none settled
    monkeypatch.setattr(pack, "CHECK_MARGIN_NS", 0)
    settled = pack.open_pack(out)
    assert settled.check is not None
    monkeypatch.setenv(pack.CHECK_ENV, settled.check)
    hashed.clear()
    records = tmp_path / "node-cache" / "pack-checks"
    next(records.rglob(f"{settled.check}.json")).parent.chmod(0o770)
    pack.open_pack(out)
    assert sum(hashed) == size


# -- the files of a model a run loads -----------------------------------------------------------------------------


def _snapshot(root: Path, files: dict[str, bytes]) -> Path:
    """A model directory as a hub snapshot or a trainer leaves it: `files` by their path inside it."""
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


LOADED = {
    "config.json": b"{}",
    "generation_config.json": b"{}",
    "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "model.safetensors": b"safetensors weights",
    "1_Pooling/config.json": b"{}",  # vLLM reads a sentence-transformers pooling config from its folder
}
NOT_LOADED = {
    "pytorch_model.bin": b"the same weights, pickled",
    "training_args.bin": b"trainer",
    "optimizer.pt": b"optimizer state",
    "original/consolidated.00.pth": b"meta's own format",
    "onnx/model.onnx": b"onnx export",
    "README.md": b"# model card",
    "LICENSE": b"licence",
    ".gitattributes": b"*.bin filter=lfs",
}


def test_pack_copies_only_the_files_a_run_loads_and_says_what_it_left_out(packable, tmp_path, scripted):  # noqa: F811
    """Safetensors over the .bin beside them (vLLM's choice), no trainer state, other formats, model card or
    repository files; everything else a run reads (config, generation config, tokenizer, chat template) is
    packed, and the run from the pack loads the model from it."""
    model = _snapshot(tmp_path / "ckpt", LOADED | NOT_LOADED)
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main")
    adapter = yaml.safe_load(packable.read_text())["target"]["lora"]
    (Path(adapter) / "adapter_model.bin").write_bytes(b"the adapter, pickled")
    (Path(adapter) / "README.md").write_text("# adapter card")
    out = tmp_path / "pack"
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(out), "--set", f"target.model={model}"])
    assert result.exit_code == 0, result.output
    lock = PackLock.model_validate_json((out / LOCK).read_text())
    parts = {p.reference: p.path for p in lock.parts}
    inside = {f.path.removeprefix(parts[str(model)] + "/") for f in lock.files if f.path.startswith(parts[str(model)])}
    assert inside == set(LOADED)
    adapter_files = {Path(f.path).name for f in lock.files if f.path.startswith(parts[adapter])}
    assert adapter_files == {"adapter_config.json", "adapter_model.safetensors"}
    said = " ".join(result.output.split())
    assert f"left out of model '{model}'" in said and "a run does not load them" in said
    for name in NOT_LOADED:
        assert name in said, name
    assert f"left out of adapter '{adapter}': README.md, adapter_model.bin" in said
    run = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out), "--set", f"target.model={model}"])
    assert run.exit_code == 0, run.output


def test_a_validated_judges_model_is_packed_by_the_files_a_run_loads_and_stays_that_judge(
    packable,  # noqa: F811
    tmp_path,
):
    """A validation names its judge's model by the hash of the files a run loads (`core.fingerprint`): the copy
    without the rest is the judge it validated."""
    from diagsafe_local.core.fingerprint import model_fingerprint

    judge = _snapshot(tmp_path / "judge-model", LOADED | {"README.md": b"# card", "pytorch_model.bin": b"w"})
    validation = tmp_path / "validated"
    validation.mkdir()
    (validation / "validation.json").write_text("{}")
    settings = ["--set", f"judge.model={judge}", "--set", f"judge.validation={validation}"]
    out = tmp_path / "pack"
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(out), *settings])
    assert result.exit_code == 0, result.output
    lock = PackLock.model_validate_json((out / LOCK).read_text())
    (part,) = [p for p in lock.parts if p.reference == str(judge)]
    packed = {f.path.removeprefix(f"{part.path}/") for f in lock.files if f.path.startswith(f"{part.path}/")}
    assert packed == set(LOADED)
    assert f"left out of model '{judge}': README.md, pytorch_model.bin" in " ".join(result.output.split())
    assert model_fingerprint(str(out / str(part.path))) == model_fingerprint(str(judge))


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize(
    "files",
    [
        {"model.safetensors": b"s", "pytorch_model.bin": b"b", "training_args.bin": b"t"},
        {"pytorch_model.bin": b"b", "training_args.bin": b"t", "optimizer.pt": b"o", "rng_state.pth": b"r"},
        {"model.pt": b"p", "scheduler.pt": b"s"},
        {  # Mistral's repositories: its own format beside the sharded one, which vLLM's auto leaves
            "consolidated.safetensors": b"c",
            "model-00001-of-00002.safetensors": b"1",
            "model-00002-of-00002.safetensors": b"2",
            "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00002.safetensors", '
            b'"b": "model-00002-of-00002.safetensors"}}',
        },
        {  # a shard the index does not name (an older export beside the new one)
            "model-00001-of-00001.safetensors": b"1",
            "model.safetensors": b"old",
            "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00001.safetensors"}}',
        },
    ],
)
def test_the_weights_packed_are_the_ones_vllms_own_loader_picks(tmp_path, files):
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from diagsafe_local.core.model_files import loaded_weights

    model = _snapshot(tmp_path / "model", {"config.json": b"{}", **files})
    _, picked, _, _ = DefaultModelLoader(LoadConfig(load_format="auto"))._prepare_weights(
        str(model), None, None, True, None
    )
    assert loaded_weights(model, "auto") == {Path(p).name for p in picked}
