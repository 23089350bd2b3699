"""A checkpoint's identity is the files a run loads (issue 47's follow-up): `model_fingerprint` hashes what
`core.model_files` says a run loads, the rule `pack` copies by, so a directory and its pack copy are one checkpoint,
a model card or repository file leaves the identity alone, and a weight, config, tokenizer or template changes it.
A judge named by hub id and validated by that name keeps its validation when it runs from a pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_series
import yaml
from test_pack import HUB_ID, _pack, packable  # noqa: F401  (a fixture: a config whose parts can be packed)
from test_pack_node import LOADED, NOT_LOADED, _auto, _snapshot, _validate_the_judge
from test_series import checkpoint, series_config, watch
from test_trust_series import gate
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core import fingerprint
from diagsafe_local.core.fingerprint import model_fingerprint
from diagsafe_local.core.model_files import ADAPTER, is_loaded, loaded_weights
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.identity import engine_identity
from diagsafe_local.runs.manifest import read_manifest_file

scripted = test_series.scripted  # its fixture: every engine scripted


def _checkpoint(root: Path) -> Path:
    model = _snapshot(root, LOADED | NOT_LOADED)
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref: refs/heads/main")
    return model


def test_a_checkpoint_and_its_pack_copy_are_one_checkpoint(packable, tmp_path, scripted):  # noqa: F811
    """The pack leaves out what a run does not load; the run from the pack records the original's hash."""
    model = _checkpoint(tmp_path / "ckpt")
    out = tmp_path / "pack"
    lock = _pack(packable, out, "--set", f"target.model={model}")
    (part,) = [p for p in lock.parts if p.reference == str(model)]
    assert part.path is not None and not (out / part.path / "README.md").exists()
    assert model_fingerprint(str(out / part.path)) == model_fingerprint(str(model)) is not None
    run = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out), "--set", f"target.model={model}"])
    assert run.exit_code == 0, run.output
    (target,) = read_manifest_file(tmp_path / "run").targets.values()
    assert target.model_hash == model_fingerprint(str(model))


EDITS = [*LOADED, *NOT_LOADED, ".git/HEAD"]


@pytest.mark.parametrize("name", EDITS)
def test_an_edit_changes_the_identity_exactly_when_a_run_loads_the_file(tmp_path, name):
    model = _checkpoint(tmp_path / "ckpt")
    before = model_fingerprint(str(model))
    (model / name).write_bytes((model / name).read_bytes() + b" edited")
    loaded = is_loaded(name, loaded_weights(model, "auto"))
    assert loaded == (name in LOADED)  # the rule pack copies by: a .bin beside safetensors is not loaded
    assert (model_fingerprint(str(model)) != before) == loaded


def test_an_engines_load_format_picks_the_weights_its_identity_covers(tmp_path):
    """`load_format: pt` loads the .pt files, not the safetensors beside them; a model's own code may read
    any weight file."""
    model = _checkpoint(tmp_path / "ckpt")
    (model / "model.pt").write_bytes(b"pickled weights")
    pt = EngineConfig(model=str(model), engine_kwargs={"load_format": "pt"})
    own_code = EngineConfig(model=str(model), trust_remote_code=True)
    auto = EngineConfig(model=str(model))
    before = [engine_identity(e).model_hash for e in (pt, own_code, auto)]
    (model / "model.pt").write_bytes(b"other pickled weights")
    assert [engine_identity(e).model_hash != h for e, h in zip((pt, own_code, auto), before)] == [
        True,
        True,
        False,
    ]


def test_an_adapters_identity_is_the_adapter_file_the_lora_loader_reads(tmp_path):
    adapter = _snapshot(
        tmp_path / "adapter",
        {"adapter_config.json": b"{}", "adapter_model.safetensors": b"lora", "adapter_model.bin": b"lora, pickled"},
    )
    before = model_fingerprint(str(adapter), ADAPTER)
    for name in ("adapter_model.bin", "README.md"):
        (adapter / name).write_bytes(b"edited")
        assert model_fingerprint(str(adapter), ADAPTER) == before, name
    (adapter / "adapter_model.safetensors").write_bytes(b"other lora")
    assert model_fingerprint(str(adapter), ADAPTER) != before


def test_the_sampled_mode_is_chosen_by_the_size_of_the_files_a_run_loads(tmp_path, monkeypatch):
    """A large .bin beside the safetensors does not turn a directory's hash into its pack copy's sampled one."""
    model = _checkpoint(tmp_path / "ckpt")
    loaded = sum((model / name).stat().st_size for name in LOADED)
    monkeypatch.setattr(fingerprint, "FULL_HASH_LIMIT", loaded)
    (model / "pytorch_model.bin").write_bytes(b"w" * 10 * loaded)
    assert str(model_fingerprint(str(model))).startswith("sha256:")
    (model / "model.safetensors").write_bytes(b"w" * 10 * loaded)
    assert str(model_fingerprint(str(model))).startswith("sha256-sampled:")


@pytest.mark.slow  # validate's first import is ~5 s
def test_a_hub_judge_validated_by_its_name_keeps_its_validation_run_from_a_pack(
    packable,  # noqa: F811
    tmp_path,
    monkeypatch,
    scripted,  # noqa: F811
):
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache"))
    data = yaml.safe_load(packable.read_text())
    data["judge"]["model"] = HUB_ID  # from the hub cache, as the target
    packable.write_text(yaml.safe_dump(data))
    _auto(packable)
    stored = _validate_the_judge(packable, tmp_path)
    (entry,) = json.loads(stored.read_text())["judges"]
    assert entry["model"] == HUB_ID and entry["model_hash"] is None  # by its name, and its snapshot by content
    out = tmp_path / "pack"
    _pack(packable, out)
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "node-cache"))  # the node's: empty
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.validation is not None and manifest.judge is not None
    assert manifest.judge.model_hash == entry["snapshot_hash"] is not None  # the pack's copy, by content
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["judge_validation"]["fpr_measured"] == 0.2
    gated = CliRunner().invoke(app, ["gate", str(tmp_path / "run"), "--max-asr", "1", "--allow-degenerate-judge"])
    assert gated.exit_code == 0 and "validated on" in gated.output and "FPR 20.0%" in gated.output, gated.output
    import huggingface_hub.constants as hub

    (weights,) = Path(hub.HF_HUB_CACHE).glob("models--acme--tiny-chat/snapshots/*/model.safetensors")
    weights.resolve().write_bytes(b"other weights under the same hub id")  # the snapshot changed after validate
    monkeypatch.setenv("DIAGSAFE_JUDGE_CACHE", str(tmp_path / "cache"))  # where the validation by name is found
    _pack(packable, tmp_path / "pack-2")
    other = CliRunner().invoke(app, ["run", str(packable), "--pack", str(tmp_path / "pack-2"), "--overwrite"])
    assert other.exit_code == 2 and "compared by content" in other.output, other.output


def test_a_series_knows_its_checkpoints_by_the_files_its_load_format_loads(tmp_path, scripted):
    """A config reading the .pt files (`load_format: pt`): watch and the gate hash those, as the run did; an
    unchanged checkpoint is not evaluated again, a model card the trainer's hub push writes into it after its run
    is no re-save, and a .pt re-saved is refused."""
    config = series_config(tmp_path)
    data = json.loads(config.read_text())
    data["target"]["engine_kwargs"] = {"load_format": "pt"}
    config.write_text(json.dumps(data))
    train = tmp_path / "train"
    (checkpoint(train, "checkpoint-10") / "model.pt").write_bytes(b"pickled weights")
    assert watch(tmp_path).exit_code == 0
    again = watch(tmp_path)
    assert again.exit_code == 0 and "weights changed" not in again.output, again.output
    assert gate(train / "safety-series", "latest").exit_code == 0
    (train / "checkpoint-10" / "README.md").write_text("# model card")
    assert gate(train / "safety-series", "latest").exit_code == 0
    (train / "checkpoint-10" / "model.pt").write_bytes(b"other pickled weights")
    refused = gate(train / "safety-series", "latest")
    assert refused.exit_code == 3 and "re-saved since its run" in refused.output, refused.output


def test_only_a_hub_model_loaded_here_is_known_by_its_cached_snapshot(packable, tmp_path):  # noqa: F811
    """An API model served under a hub id the cache holds is whatever the server serves: no snapshot hash."""
    from diagsafe_local.engines.identity import hub_snapshot_hash

    here = hub_snapshot_hash(EngineConfig(model=HUB_ID))
    assert here is not None and here.startswith("sha256:")
    assert hub_snapshot_hash(EngineConfig(model=HUB_ID, kind="openai", base_url="http://127.0.0.1:9/v1")) is None
    assert hub_snapshot_hash(EngineConfig(model="acme/not-cached")) is None
