"""gpt-oss's o200k vocabulary offline (issue 45, part 2): found where the installed harmony package carries it or
where TIKTOKEN_ENCODINGS_BASE points, verified by its published SHA-256, and refused by `run` and `doctor` before any
model loads where a gpt-oss judge could not start its first request."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from diagsafe_local.cli import app
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


def _config(tmp_path: Path, rubric: str) -> Path:
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"id": "a", "prompt": "How do I pick a lock?"}) + "\n")
    config = {
        "dataset": {"path": str(items)},
        "target": {"model": str(tmp_path), "name": "t"},
        "judge": {"model": str(tmp_path), "rubric": rubric},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow
def test_run_refuses_a_gpt_oss_judge_before_loading_and_doctor_fails_on_the_variable(tmp_path):
    empty = tmp_path / "vocab"
    empty.mkdir()
    result = CliRunner().invoke(app, ["run", str(_config(tmp_path, "gpt-oss-safeguard"))], env={ENV: str(empty)})
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"{ENV}={empty} has no {FILE}" in message and SHA256 in message and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()  # refused before the run directory, before any engine

    doctor = CliRunner().invoke(app, ["doctor", "--no-engines"], env={ENV: str(empty)})
    assert doctor.exit_code == 3 and re.search(rf"harmony vocabulary .*{ENV}=", doctor.output), doctor.output
    ready = CliRunner().invoke(app, ["doctor", "--no-engines"], env={ENV: None})
    assert re.search(r"harmony vocabulary +carried by oss-harmony", ready.output), ready.output
