"""Hub dataset resolution (network replaced by a local snapshot) and offline WordNet preparation."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import current_rows, write_jsonl

from diagsafe_local.core import hub
from diagsafe_local.core.errors import DataError, DiagsafeError
from diagsafe_local.metrics.wordnet import DEBIAN_WORDNET, lexnames_from_man, prepare_debian_wordnet


def test_local_path_wins(current_file):
    assert hub.resolve_dataset(str(current_file)) == current_file


def test_hub_id_downloads_into_cache_and_picks_the_data_file(tmp_path, monkeypatch):
    calls = []

    def fake_snapshot_download(repo_id, repo_type, allow_patterns, cache_dir):
        calls.append((repo_id, repo_type, tuple(allow_patterns), Path(cache_dir)))
        root = Path(cache_dir) / "snap"
        root.mkdir(parents=True, exist_ok=True)
        write_jsonl(root / "HarmMetric_Eval.jsonl", current_rows())
        (root / "README.md").write_text("card")
        return str(root)

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    path = hub.resolve_dataset("someone/HarmMetric_Eval")
    assert path.name == "HarmMetric_Eval.jsonl"
    assert calls == [("someone/HarmMetric_Eval", "dataset", ("*.json", "*.jsonl"), tmp_path / "cache" / "hub")]
    write_jsonl(path.parent / "other.jsonl", current_rows())
    with pytest.raises(DataError, match=r"expected one file matching \*.json, \*.jsonl"):
        hub.resolve_dataset("someone/HarmMetric_Eval")
    assert hub.resolve_dataset("someone/HarmMetric_Eval:other.jsonl").name == "other.jsonl"


def test_hub_id_resolves_to_the_same_file_offline_afterwards(tmp_path, monkeypatch):
    def fetch(repo_id, repo_type, allow_patterns, cache_dir):
        root = Path(cache_dir) / "datasets--Abel-24--HarmMetric_Eval" / "snapshots" / "abc"
        root.mkdir(parents=True, exist_ok=True)
        write_jsonl(root / "HarmMetric_Eval.jsonl", current_rows())
        return str(root)

    def offline(**kwargs):
        raise OSError("network unreachable")

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", fetch)
    online = hub.resolve_dataset("Abel-24/HarmMetric_Eval")
    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    assert hub.resolve_dataset("Abel-24/HarmMetric_Eval") == online
    with pytest.raises(DiagsafeError, match="could not fetch dataset 'Abel-24/Other'"):
        hub.resolve_dataset("Abel-24/Other")


def test_hub_failure_is_one_clear_error(monkeypatch, tmp_path):
    def offline(**kwargs):
        raise OSError("network unreachable")

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(DiagsafeError, match="could not fetch dataset 'a/b'.*Offline"):
        hub.resolve_dataset("a/b")
    with pytest.raises(DataError, match="no such file"):
        hub.resolve_dataset(str(tmp_path / "missing.jsonl"))


def test_lexnames_rebuilt_from_debian_man_page():
    text = lexnames_from_man()
    lines = text.splitlines()
    assert len(lines) == 45
    assert lines[0] == "00\tadj.all\t3" and lines[3] == "03\tnoun.Tops\t1" and lines[-1] == "44\tadj.ppl\t3"


def test_debian_wordnet_prepared_offline_reads_synonyms(tmp_path):
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = prepare_debian_wordnet(tmp_path / "nltk_data")
    assert prepare_debian_wordnet(tmp_path / "nltk_data") == root  # idempotent
    nltk.data.path.append(str(root))
    try:
        reader = WordNetCorpusReader(nltk.data.find("corpora/wordnet"), None)
        lemmas = {line.name() for s in reader.synsets("car") for line in s.lemmas()}
        assert "auto" in lemmas
    finally:
        nltk.data.path.remove(str(root))


def test_missing_wordnet_says_how_to_install(tmp_path):
    with pytest.raises(DiagsafeError, match="apt-get install wordnet-base"):
        prepare_debian_wordnet(tmp_path / "x", source=tmp_path / "nowhere")
    assert DEBIAN_WORDNET.is_dir()  # set-up installs it; METEOR must never run without synonyms


def test_a_gold_set_by_url_is_fetched_once_over_real_http_then_read_offline(tmp_path, monkeypatch):
    """XSTest's completions live on GitHub, not on the hub: validate takes their URL. Served here by a real
    HTTP server; after the server stops, the same URL resolves to the cached copy."""
    import functools
    import http.server
    import shutil
    import threading

    from helpers import REPO

    from diagsafe_local.validation.gold import load_gold

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "cache"))
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(REPO / "data" / "gold_xstest_sample.csv", served / "xstest_v2_completions_gpt4.csv")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/xstest_v2_completions_gpt4.csv"
    try:
        first = load_gold(url, "xstest")
    finally:
        server.shutdown()
        server.server_close()
    again = load_gold(url, "xstest")
    assert first.sha256 == again.sha256 and len(again.items) == 36 and again.path == first.path
    with pytest.raises(DiagsafeError, match="could not download"):
        load_gold(url.replace("gpt4", "llama2new"), "xstest")
    assert not list((tmp_path / "cache" / "hub" / "urls").rglob("*.partial"))


def test_a_jbb_hub_id_picks_the_judge_comparison_file(tmp_path, monkeypatch):
    from helpers import REPO

    from diagsafe_local.validation.gold import load_gold

    def fake_snapshot_download(repo_id, repo_type, allow_patterns, cache_dir):
        root = Path(cache_dir) / "snap"
        (root / "data").mkdir(parents=True, exist_ok=True)
        import fnmatch
        import shutil

        for name in ("judge_comparison.csv", "harmful-behaviors.csv"):
            if any(fnmatch.fnmatch(f"data/{name}", p) for p in allow_patterns):
                shutil.copy(REPO / "data" / "gold_jbb_sample.csv", root / "data" / name)
        return str(root)

    monkeypatch.setenv("DIAGSAFE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    gold = load_gold("JailbreakBench/JBB-Behaviors", "jbb")
    assert gold.path.endswith("data/judge_comparison.csv") and len(gold.items) == 20
