"""`pack CONFIG --out DIR` and `run --pack DIR` (issue 47, item 1): every part a config needs copied once with its
hash, a run that reads only from the pack, and the refusals before anything loads: a part the pack lacks, a
file whose bytes changed, a pack whose packing was cut short. The real engine's run from a pack inside a closed
network namespace is in test_offline.py (one real run)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from test_series import checkpoint, scripted  # noqa: F401  (a fixture: every engine the pipeline makes is scripted)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.pack import LOCK, PackLock, open_pack
from diagsafe_local.runs.manifest import read_manifest_file

HUB_ID = "acme/tiny-chat"


def _hub_cache(root: Path, source: Path, repo_id: str = HUB_ID) -> Path:
    """A Hugging Face hub cache holding `source` as `repo_id`'s snapshot at one commit (as `hf download` leaves
    it)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return root


@pytest.fixture
def packable(tmp_path, monkeypatch):
    """A config whose target is a hub id found only in the hub cache (no network: HF_HUB_OFFLINE), with a LoRA
    adapter and a chat template in local folders, and whose judge is a local model directory."""
    import huggingface_hub.constants as hub

    models = tmp_path / "models"
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(_hub_cache(tmp_path / "hub", checkpoint(models, "base"))))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    adapter = models / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": HUB_ID, "r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"lora weights")
    template = tmp_path / "chatml.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"i{k}", "prompt": f"question {k}"}) + "\n" for k in range(3)))
    config = {
        "dataset": {"path": str(items)},
        "target": {"name": "tiny", "model": HUB_ID, "lora": str(adapter), "chat_template": str(template)},
        "judge": {"model": str(checkpoint(models, "judge"))},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _pack(config: Path, out: Path, *options: str) -> PackLock:
    result = CliRunner().invoke(app, ["pack", str(config), "--out", str(out), *options])
    assert result.exit_code == 0, result.output
    return PackLock.model_validate_json((out / LOCK).read_text())


def test_pack_copies_every_part_with_its_hash_and_a_run_from_it_reads_only_the_pack(packable, tmp_path, scripted):  # noqa: F811
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    kinds = {(part.kind, part.reference) for part in lock.parts}
    config = yaml.safe_load(packable.read_text())
    assert kinds == {
        ("model", HUB_ID), ("adapter", config["target"]["lora"]), ("chat_template", config["target"]["chat_template"]),
        ("model", config["judge"]["model"]), ("dataset", config["dataset"]["path"]),
    }  # fmt: skip
    assert (
        next(p.origin for p in lock.parts if p.reference == HUB_ID) == f"hub:{HUB_ID}@{'0123456789abcdef' * 2}01234567"
    )
    for packed in lock.files:  # each file as listed: its bytes, its size, where it came from
        data = (out / packed.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == packed.sha256 and len(data) == packed.size
        assert Path(packed.source).read_bytes() == data
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 0, result.output
    assert scripted and all(Path(model).is_relative_to(out.resolve()) for model in scripted)  # target and judge
    manifest = read_manifest_file(tmp_path / "run")
    network = manifest.network
    assert network is not None and network.offline
    assert network.pack == hashlib.sha256((out / LOCK).read_bytes()).hexdigest()
    assert list(manifest.targets) == ["tiny"]  # the config's label, not the pack folder's name
    target = manifest.config["targets"][0]
    assert all(Path(target[key]).is_relative_to(out.resolve()) for key in ("model", "lora", "chat_template"))


def test_the_configs_offline_pack_key_runs_from_the_pack_too(packable, tmp_path, scripted):  # noqa: F811
    out = tmp_path / "pack"
    _pack(packable, out)
    result = CliRunner().invoke(app, ["run", str(packable), "--set", f"offline.pack={out}"])
    assert result.exit_code == 0, result.output
    network = read_manifest_file(tmp_path / "run").network
    assert network is not None and network.offline and network.pack is not None
    assert all(Path(model).is_relative_to(out.resolve()) for model in scripted)


def test_a_config_needing_a_part_the_pack_lacks_is_refused_before_anything_loads(packable, tmp_path):
    out = tmp_path / "pack"
    _pack(packable, out)
    other = tmp_path / "other-judge"
    other.mkdir()
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out), "--set", f"judge.model={other}"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output  # no traceback
    message = " ".join(result.output.split())
    assert f"has no model '{other}'" in message and f"diagsafe-local pack CONFIG --out {out}" in message
    assert not (tmp_path / "run").exists()  # before the run directory, before any engine


def test_a_one_byte_change_of_a_packed_file_is_refused_naming_it(packable, tmp_path, scripted):  # noqa: F811
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    weights = next(f for f in lock.files if f.path.endswith("model.safetensors"))
    data = bytearray((out / weights.path).read_bytes())
    data[-1] ^= 1
    (out / weights.path).write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 3, result.output
    assert f"{out / weights.path}: its bytes are not the ones packed" in " ".join(result.output.split())
    assert not scripted and not (tmp_path / "run").exists()
    (out / weights.path).unlink()
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 2 and f"{out / weights.path}: missing from the pack" in " ".join(result.output.split())


def test_an_interrupted_pack_leaves_the_older_pack_or_none_never_a_lock_naming_absent_files(
    packable, tmp_path, monkeypatch
):
    from diagsafe_local.evaluation import pack

    copy, copied = pack._copy, []

    def cut_short(*args):
        if copied:
            raise KeyboardInterrupt
        copied.append(args)
        return copy(*args)

    monkeypatch.setattr(pack, "_copy", cut_short)
    fresh = tmp_path / "fresh"
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(fresh)])
    assert result.exit_code != 0 and not fresh.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [
        ".fresh.packing.lock"
    ]  # no staging left behind
    monkeypatch.setattr(pack, "_copy", copy)
    older = _pack(packable, tmp_path / "pack")
    copied.clear()
    monkeypatch.setattr(pack, "_copy", cut_short)
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(tmp_path / "pack")])
    assert result.exit_code != 0
    assert open_pack(tmp_path / "pack").lock == older  # the older pack, whole and verified


def test_pack_refuses_a_folder_that_is_not_a_pack_and_a_model_it_cannot_find(packable, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(taken)])
    assert result.exit_code == 2 and "a folder that is not a pack" in result.output
    assert (taken / "notes.txt").read_text() == "mine"
    result = CliRunner().invoke(
        app, ["pack", str(packable), "--out", str(tmp_path / "p"), "--set", "target.model=acme/not-cached"]
    )
    assert result.exit_code == 2, result.output
    assert "model 'acme/not-cached' is neither a local directory nor in the Hugging Face cache" in " ".join(
        result.output.split()
    )


@pytest.mark.slow
def test_a_metric_judges_data_is_packed_and_read_from_the_pack(packable, tmp_path):
    """METEOR's WordNet and the embedding model's files go into the pack, and with the pack in force the metrics
    find them there (and nowhere else)."""
    from diagsafe_local.core.pack import using
    from diagsafe_local.metrics.embedding import model_directory
    from diagsafe_local.metrics.wordnet import wordnet_directory

    meteor, embedding = {"metric": "meteor", "threshold": 0.3}, {"metric": "embedding_cosine", "threshold": 0.5}
    panel = f"judge={json.dumps({**meteor, 'panel': {'rule': 'any', 'members': [meteor, embedding]}})}"
    out = tmp_path / "pack"
    result = CliRunner().invoke(app, ["pack", str(packable), "--out", str(out), "--set", panel])
    assert result.exit_code == 0, result.output
    with using(open_pack(out)) as pack:
        found = {part.kind: pack.root / part.path for part in pack.lock.parts}
        assert wordnet_directory() == found["wordnet"] and (found["wordnet"] / "data.noun").is_file()
        assert model_directory() == found["embedding"] and (found["embedding"] / "config.json").is_file()
        assert found["wordnet"].parts[-2:] == ("corpora", "wordnet")  # NLTK reads it below a data root
    assert wordnet_directory() != found["wordnet"]  # outside the pack: where it was packed from


def test_a_gpt_oss_model_gets_its_vocabulary_packed_and_the_run_reads_it_from_the_pack(packable, tmp_path, monkeypatch):
    """A gpt-oss model served here needs the o200k vocabulary at its first request: `pack` copies the file
    `judging.harmony_vocab` locates, and `run --pack` points harmony at the pack's copy (TIKTOKEN_ENCODINGS_BASE)
    for the run and every engine process."""
    from fakes import ScriptedEngine

    from diagsafe_local.judging import harmony_vocab

    vocabulary = tmp_path / "cache" / harmony_vocab.FILE
    vocabulary.parent.mkdir()
    vocabulary.write_bytes(harmony_vocab.tiktoken_file([b"!", b'"', b"#"]))
    monkeypatch.setattr(harmony_vocab, "vocabulary_file", lambda: vocabulary)
    monkeypatch.setattr(harmony_vocab, "SHA256", hashlib.sha256(vocabulary.read_bytes()).hexdigest())
    monkeypatch.delenv(harmony_vocab.ENV, raising=False)
    gpt_oss = checkpoint(tmp_path / "models", "gpt-oss")
    (gpt_oss / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    seen: list[str | None] = []

    def factory(config, **options):
        seen.append(os.environ.get(harmony_vocab.ENV))
        return ScriptedEngine(model=config.model)

    monkeypatch.setattr("diagsafe_local.evaluation.pipeline.create_engine", factory)
    out = tmp_path / "pack"
    lock = _pack(packable, out, "--set", f"target.model={gpt_oss}", "--set", "target.lora=null")
    (part,) = [p for p in lock.parts if p.kind == "vocabulary"]
    assert (out / part.path).read_bytes() == vocabulary.read_bytes() and part.origin == str(vocabulary)
    result = CliRunner().invoke(
        app, ["run", str(packable), "--pack", str(out), "--set", f"target.model={gpt_oss}", "--set", "target.lora=null"]
    )
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {str((out / part.path).parent)}
    assert harmony_vocab.ENV not in os.environ  # restored after the run


def test_a_hub_adapter_given_as_the_model_runs_from_the_pack_on_a_node_whose_hub_cache_lacks_it(
    packable,
    tmp_path,
    monkeypatch,
    scripted,  # noqa: F811
):
    """`model: OWNER/ADAPTER` is served on the base its adapter_config.json names, which the config reads from the
    hub cache; on the node that cache is absent, and the pack still knows the adapter and its base."""
    import huggingface_hub.constants as hub

    adapter = tmp_path / "hub-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": HUB_ID, "r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"lora weights")
    _hub_cache(Path(hub.HF_HUB_CACHE), adapter, "acme/tiny-adapter")
    as_model = ["--set", "target.model=acme/tiny-adapter", "--set", "target.lora=null"]
    lock = _pack(packable, tmp_path / "pack", *as_model)
    assert {(p.kind, p.reference, p.base) for p in lock.parts} >= {("adapter", "acme/tiny-adapter", HUB_ID)}
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the node's
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(tmp_path / "pack"), *as_model])
    assert result.exit_code == 0, result.output
    target = read_manifest_file(tmp_path / "run").config["targets"][0]
    assert Path(target["model"]).name.startswith("tiny-chat-") and Path(target["lora"]).name.startswith("tiny-adapter-")


def _policy_config(packable: Path, tmp_path: Path) -> Path:
    """`packable` judged by a policy file of its own (harmjudge's fields under another name), beside the config."""
    from diagsafe_local.core.resources import data_file

    policy = yaml.safe_load(data_file("policy_harmjudge.yaml").read_text(encoding="utf-8"))
    path = tmp_path / "policies" / "acme-harm.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({**policy, "name": "acme-harm"}))
    config = yaml.safe_load(packable.read_text())
    config["judge"]["rubric"] = str(path)
    packable.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("after_packing", ["moved away", "edited"])
def test_a_judges_policy_file_is_packed_and_the_run_reads_the_packs_copy(
    packable,
    tmp_path,
    scripted,  # noqa: F811
    after_packing,
):
    """The policy file a judge names is a part of the pack: the run judges with the bytes packed, whether the
    original is gone on the node or was edited after packing, and the manifest names the pack's copy."""
    policy = _policy_config(packable, tmp_path)
    packed_bytes = policy.read_bytes()
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    (part,) = [p for p in lock.parts if p.kind == "policy"]
    assert part.reference == str(policy) and (out / part.path).read_bytes() == packed_bytes
    if after_packing == "moved away":
        policy.rename(tmp_path / "elsewhere.yaml")
    else:
        policy.write_text(policy.read_text().replace("acme-harm", "acme-harm-v2"))
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest_file(tmp_path / "run")
    assert manifest.judge is not None
    assert manifest.judge.settings["policies"] == {"acme-harm": f"sha256:{hashlib.sha256(packed_bytes).hexdigest()}"}
    assert Path(manifest.config["judge"]["rubric"]) == (out / part.path).resolve()


def test_a_policy_file_or_validation_the_pack_lacks_is_refused_before_anything_loads(packable, tmp_path):
    """A config naming a policy file (a jury member's too) or a judge validation packed for no config of this
    pack is refused, naming it and the `pack` command, before the run directory."""
    out = tmp_path / "pack"
    _pack(packable, out)
    policy = _policy_config(packable, tmp_path)
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(out)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    message = " ".join(result.output.split())
    assert f"has no policy '{policy}'" in message and f"diagsafe-local pack CONFIG --out {out}" in message
    validation = tmp_path / "validated"
    validation.mkdir()
    (validation / "validation.json").write_text("{}")
    _pack(packable, out)  # now with the policy
    result = CliRunner().invoke(
        app, ["run", str(packable), "--pack", str(out), "--set", f"judge.validation={validation}"]
    )
    assert result.exit_code == 2, result.output
    assert f"has no validation '{validation}'" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()


def test_pack_copies_a_jury_members_policy_file_and_the_judges_validation(packable, tmp_path):
    from diagsafe_local.evaluation.pack import packed

    policy = _policy_config(packable, tmp_path)
    validation = tmp_path / "validated"
    validation.mkdir()
    (validation / "validation.json").write_text('{"written by": "validate"}')
    config = yaml.safe_load(packable.read_text())
    judge = config["judge"]
    jurors = [{"model": judge["model"], "rubric": "harmjudge"}, {"model": judge["model"], "rubric": str(policy)}]
    config["judge"] = {"model": judge["model"], "jury": {"members": jurors}, "validation": str(validation)}
    packable.write_text(yaml.safe_dump(config))
    out = tmp_path / "pack"
    lock = _pack(packable, out)
    found = {p.kind: p for p in lock.parts}
    assert found["policy"].reference == str(policy) and found["validation"].reference == str(validation)
    packed_validation = out / found["validation"].path
    assert packed_validation.name == "validation.json"
    assert packed_validation.read_bytes() == (validation / "validation.json").read_bytes()
    policy.unlink()
    cfg, pack = packed(packable, [], out)
    assert (
        cfg.judge.jury is not None and Path(cfg.judge.jury.members[1].rubric) == (out / found["policy"].path).resolve()
    )
    assert cfg.judge.validation is not None and Path(cfg.judge.validation) == packed_validation.parent.resolve()


def test_a_packed_adapter_above_max_lora_rank_is_refused_before_loading_naming_the_field(
    packable,
    tmp_path,
    monkeypatch,
    scripted,  # noqa: F811
):
    """A hub adapter given as the model has no rank the config can read where the node's hub cache lacks it; read
    from the pack, its rank 128 against max_lora_rank 64 is refused before any engine (vLLM's worker would refuse
    it at the first request: `peft_helper.validate_legal`), naming the field and the value to set."""
    import huggingface_hub.constants as hub

    adapter = tmp_path / "hub-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": HUB_ID, "r": 128}))
    (adapter / "adapter_model.safetensors").write_bytes(b"lora weights")
    _hub_cache(Path(hub.HF_HUB_CACHE), adapter, "acme/big-adapter")
    as_model = ["--set", "target.model=acme/big-adapter", "--set", "target.lora=null"]
    _pack(packable, tmp_path / "pack", *as_model, "--set", "target.max_lora_rank=128")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))  # the node's
    result = CliRunner().invoke(app, ["run", str(packable), "--pack", str(tmp_path / "pack"), *as_model])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output  # no traceback
    message = " ".join(result.output.split())
    assert "targets.0" in message and "rank 128, above max_lora_rank 64: set max_lora_rank to 128" in message
    assert not scripted and not (tmp_path / "run").exists()


def test_pack_copies_the_cascade_judges_policy_file(packable, tmp_path):
    from diagsafe_local.evaluation.pack import packed

    policy = _policy_config(packable, tmp_path)
    config = yaml.safe_load(packable.read_text())
    model = config["judge"]["model"]
    config["judge"] = {"model": model, "cascade": {"judge": {"model": model, "rubric": str(policy)}}}
    packable.write_text(yaml.safe_dump(config))
    out = tmp_path / "pack"
    (part,) = [p for p in _pack(packable, out).parts if p.kind == "policy"]
    policy.write_text("edited after packing")
    cfg, _ = packed(packable, [], out)
    assert cfg.judge.cascade is not None and Path(cfg.judge.cascade.judge.rubric) == (out / part.path).resolve()
