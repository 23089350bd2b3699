"""gpt-oss's o200k vocabulary offline (issue 45, part 2): found where the installed harmony package carries it or
where TIKTOKEN_ENCODINGS_BASE points, verified by its published SHA-256, and packed for a `vllm serve` of gpt-oss on
the node. Our own engines (vLLM's offline `LLM`) never load it, so a run is not refused for it and `doctor` only
notes it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from test_series import checkpoint, scripted  # noqa: F401  (a fixture: every engine the pipeline makes is scripted)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.evaluation.config import load_config
from diagsafe_local.judging import harmony_vocab
from diagsafe_local.judging.harmony_vocab import ENV, FILE, SHA256, VocabularyMissing, vocabulary, vocabulary_file


@pytest.fixture(scope="module")
def o200k(tmp_path_factory) -> Path:
    """The vocabulary as the installed package writes it out (once for the module)."""
    path = tmp_path_factory.mktemp("o200k") / FILE
    path.write_bytes(harmony_vocab.package_vocabulary())
    return path


@pytest.mark.slow
def test_the_installed_harmony_package_carries_o200k_byte_for_byte(o200k):
    """The file's facts, as tiktoken itself states them (tiktoken_ext/openai_public.py, `o200k_base`'s
    expected_hash) and as openaipublic serves it (3,613,922 bytes): what oss-harmony decodes is that file."""
    import tiktoken_ext.openai_public as published

    stated = re.search(r'o200k_base\.tiktoken",\s*expected_hash="([0-9a-f]{64})"', Path(published.__file__).read_text())
    assert stated is not None and stated.group(1) == SHA256
    data = o200k.read_bytes()
    assert len(data) == 3_613_922 and hashlib.sha256(data).hexdigest() == SHA256
    assert data.startswith(b"IQ== 0\n") and data.endswith(b" 199997\n")  # rank 0 is "!", as tiktoken's file


@pytest.fixture
def small(tmp_path, monkeypatch) -> Path:
    """A stand-in vocabulary file, its digest taken as the published one (the real file's test is above)."""
    path = tmp_path / "small" / FILE
    path.parent.mkdir()
    path.write_bytes(harmony_vocab.tiktoken_file([b"!", b'"', b"#"]))
    monkeypatch.setattr(harmony_vocab, "SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return path


def test_the_variable_s_file_is_used_and_checked(small, tmp_path, monkeypatch):
    o200k = small
    assert o200k.read_bytes() == b"IQ== 0\nIg== 1\nIw== 2\n"  # tiktoken's format: base64 of the bytes, the rank
    monkeypatch.setenv(ENV, str(o200k.parent))
    found = vocabulary()
    assert found.source == "variable" and found.path == o200k and vocabulary_file() == o200k
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(ENV, str(empty))
    with pytest.raises(VocabularyMissing, match=f"{ENV}={re.escape(str(empty))} has no {FILE}.*{SHA256[:12]}"):
        vocabulary()
    (empty / FILE).write_bytes(b"IQ== 0\n")
    with pytest.raises(VocabularyMissing, match="is not o200k_base"):
        vocabulary()


def test_without_the_variable_the_package_s_vocabulary_is_written_once_into_the_cache(small, tmp_path, monkeypatch):
    o200k = small
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path))
    assert vocabulary().source == "package"
    monkeypatch.setattr(harmony_vocab, "package_vocabulary", o200k.read_bytes)  # what the first test checked
    path = vocabulary_file()
    assert path == tmp_path / "harmony" / FILE and path.read_bytes() == o200k.read_bytes()
    monkeypatch.setattr(harmony_vocab, "package_vocabulary", lambda: pytest.fail("written again"))
    assert vocabulary_file() == path


def test_a_package_that_downloads_it_is_refused_offline(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    versions = {"openai-harmony": "0.0.4"}
    monkeypatch.setattr(harmony_vocab, "_version", versions.get)
    with pytest.raises(VocabularyMissing, match=f"openai-harmony 0.0.4 downloads {FILE} at the first request.*{ENV}"):
        vocabulary()


def test_a_gpt_oss_run_is_not_refused_for_the_vocabulary_and_doctor_only_notes_it(tmp_path, scripted):  # noqa: F811
    """vLLM's offline `LLM` renders through `renderers/registry.py` `renderer_from_config` (HfRenderer) and never
    calls `harmony_utils.get_encoding`; only the OpenAI server's HarmonyParser does. So a gpt-oss model served
    here runs with TIKTOKEN_ENCODINGS_BASE naming a folder without the file."""
    from diagsafe_local.commands.doctor import harmony_check

    empty = tmp_path / "vocab"
    empty.mkdir()
    gpt_oss = checkpoint(tmp_path / "models", "gpt-oss")
    (gpt_oss / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "a", "prompt": "How do I pick a lock?"}) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "dataset": {"path": str(items)},
                "target": {"model": str(gpt_oss), "name": "t"},
                "judge": {"model": "j"},
                "output_dir": str(tmp_path / "run"),
            }
        )
    )
    assert harmony_vocab.serves_harmony(load_config(config).judge, [str(gpt_oss)])  # what `pack` packs it for
    result = CliRunner().invoke(app, ["run", str(config)], env={ENV: str(empty)})
    assert result.exit_code == 0, result.output
    assert str(gpt_oss) in scripted

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV, str(empty))
        note = harmony_check()
    assert note.status == "warn" and "vllm serve" in note.detail and f"{ENV}={empty} has no {FILE}" in note.detail
    here = harmony_check()  # this machine's: a note either way, never a FAIL
    assert here.status in {"ok", "warn"} and "vllm serve" in here.detail
