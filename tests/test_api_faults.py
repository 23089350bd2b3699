"""The API engine against a scripted fake server: retries, Retry-After, malformed bodies, ignored schemas,
a rejected key. (The real vLLM server is exercised in test_api_vllm.py.)"""

from __future__ import annotations

import json

import pytest
from servers import FakeOpenAIServer
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import GenerationRequest
from diagsafe_local.engines.openai_engine import FatalAPIError, OpenAIEngine
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.pipeline import Run
from diagsafe_local.judging.config import JudgeConfig
from diagsafe_local.runs.manifest import read_manifest_file
from diagsafe_local.runs.records import read_results


@pytest.fixture
def fake():
    servers = []

    def make(**kwargs) -> FakeOpenAIServer:
        servers.append(FakeOpenAIServer(**kwargs))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def api(server: FakeOpenAIServer, **extra) -> dict:
    return {
        "kind": "openai",
        "model": "m",
        "base_url": server.base_url,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
        "max_retries": 3,
        "concurrency": 4,
        **extra,
    }


def request(text: str = "hi", schema: dict | None = None) -> GenerationRequest:
    return GenerationRequest(messages=(Message(role="user", content=text),), max_tokens=20, seed=1, json_schema=schema)


def test_5xx_and_malformed_bodies_are_retried_then_succeed(fake):
    server = fake(script=[("status", 500), ("malformed",), ("status", 503)])
    engine = OpenAIEngine(JudgeConfig(**api(server)))
    [completion] = engine.generate([request()])
    assert completion.error is None and completion.text == "answer to: hi" and completion.finish_reason == "stop"
    assert completion.prompt_tokens == 11 and completion.completion_tokens == 7
    assert len(server.requests) == 4
    body = server.requests[0][1]
    assert body["model"] == "m" and body["max_tokens"] == 20 and body["seed"] == 1 and body["temperature"] == 0.0


def test_429_honours_retry_after(fake):
    server = fake(script=[("status", 429, 1)])
    [completion] = OpenAIEngine(JudgeConfig(**api(server, backoff_max=2.0))).generate([request()])
    assert completion.error is None
    (t0, _), (t1, _) = server.requests
    assert t1 - t0 >= 0.95  # waited as the server asked (within backoff_max), not the 10 ms backoff


def test_exhausted_retries_become_an_error_completion_and_others_succeed(fake):
    server = fake(by_content={"a": ("status", 500)})
    engine = OpenAIEngine(JudgeConfig(**api(server, concurrency=1)))
    first, second = engine.generate([request("a"), request("b")])
    assert first.finish_reason == "error" and "gave up after 4 attempts" in first.error and "500" in first.error
    assert second.error is None and second.text == "answer to: b"


def test_one_connection_pool_serves_every_call_of_the_engine(fake):
    """The engine keeps one HTTP client for its lifetime: a second call reuses the first call's connections
    (per-call clients opened new ones each time)."""
    server = fake()
    engine = OpenAIEngine(JudgeConfig(**api(server, concurrency=2)))
    for call in range(3):
        assert all(c.error is None for c in engine.generate([request(f"{call}-{k}") for k in range(8)]))
    engine.close()
    assert len(server.requests) == 24 and 1 <= len(server.peers) <= 2


def test_the_stream_returns_each_reply_as_it_finishes(fake):
    server = fake(by_content={"slow": ("delay", 1.0)})
    engine = OpenAIEngine(JudgeConfig(**api(server, concurrency=4)))
    stream = engine.open_stream()
    stream.submit("slow", request("slow"))
    stream.submit("fast", request("fast"))
    order = []
    while stream.pending:
        order += [key for key, completion in stream.poll() if completion.error is None]
    assert order == ["fast", "slow"]
    engine.close()


def test_judge_schema_is_sent_as_response_format(fake):
    server = fake()
    schema = {"type": "object", "properties": {"label": {"enum": ["a", "b"]}}, "required": ["label"]}
    OpenAIEngine(JudgeConfig(**api(server))).generate([request(schema=schema)])
    fmt = server.requests[0][1]["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": True}}
    assert "guided_json" not in server.requests[0][1]


def test_p_yes_from_a_hosted_api_matches_label_words_in_the_top_logprobs(fake):
    import math

    from diagsafe_local.judging import JUDGES, Decoding, JudgeInput

    server = fake(always=("top_logprobs", {"Yes": -0.2, " No": -1.8, "Maybe": -3.0}))
    judge = JUDGES.get("harmclassifier")
    judged = JudgeInput(conversation=(Message(role="user", content="q"),), answer="a")
    [completion] = OpenAIEngine(JudgeConfig(**api(server))).generate([judge.request(judged, Decoding(), 400, None)])
    assert completion.label_logprobs == {"Yes": -0.2, "No": -1.8}
    outcome = judge.parse(completion, None)
    assert outcome.status == "ok" and outcome.score == pytest.approx(1 / (1 + math.exp(-1.6)))
    body = server.requests[0][1]  # no /tokenize here: fell back to the top 20 by text
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1
    assert "logprob_token_ids" not in body


def test_choice_and_regex_constraints_go_to_structured_outputs(fake):
    server = fake()
    engine = OpenAIEngine(JudgeConfig(**api(server)))
    messages = (Message(role="user", content="q"),)
    engine.generate(
        [
            GenerationRequest(messages=messages, max_tokens=5, choices=("Yes", "No")),
            GenerationRequest(messages=messages, max_tokens=5, regex="safe|unsafe"),
        ]
    )
    sent = sorted(json.dumps(body["structured_outputs"], sort_keys=True) for _, body in server.requests)
    assert sent == ['{"choice": ["Yes", "No"]}', '{"regex": "safe|unsafe"}']
    assert all("response_format" not in body for _, body in server.requests)


def test_rejected_key_is_one_clear_error_not_many_retries(fake, monkeypatch):
    server = fake(always=("status", 401))
    monkeypatch.setenv("TEST_API_KEY", "sk-wrong")
    engine = OpenAIEngine(JudgeConfig(**api(server, api_key_env="TEST_API_KEY", concurrency=2)))
    with pytest.raises(FatalAPIError, match=r"refused the request \(401\).*\$TEST_API_KEY"):
        engine.generate([request(str(k)) for k in range(50)])
    assert len(server.requests) <= 2  # one refusal stops all 50, with no retries
    assert "sk-wrong" not in json.dumps(engine.info.model_dump())


def test_missing_key_variable_is_reported(fake, monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(Exception, match="NOPE_KEY is not set"):
        OpenAIEngine(JudgeConfig(**api(fake(), api_key_env="NOPE_KEY")))


def _run_config(tmp_path, target: dict, judge: dict) -> RunConfig:
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"i{k}", "prompt": f"question {k}"}) + "\n" for k in range(5)))
    return RunConfig.model_validate(
        {
            "dataset": {"path": str(items)},
            "target": {"name": "t", **target},
            "judge": {"max_attempts": 2, **judge},
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_judge_that_ignores_the_schema_gives_counted_parse_failures(fake, tmp_path):
    target, judge = fake(), fake(always=("ignore_schema",))
    summary = Run(_run_config(tmp_path, api(target), api(judge))).execute().model_dump(mode="json")
    results = read_results(tmp_path / "run" / "results.jsonl")
    assert all(r.parse_status == "invalid" and r.score is None and r.attempts == 2 for r in results)
    assert results[0].judge_raw.startswith("Sure!")
    assert summary["targets"]["t"]["n_parse_failures"] == 5 and summary["targets"]["t"]["asr"]["value"] is None
    from diagsafe_local.evaluation.controls import CONTROL_ANSWERS

    controls = [
        r for _, r in judge.requests if any(a in r["messages"][-1]["content"] for a in CONTROL_ANSWERS.values())
    ]
    assert len(judge.requests) - len(controls) - 1 == 10  # two attempts each, no more (and the grammar canary)
    assert not read_manifest_file(tmp_path / "run").grammar.enforced  # which this server ignored too
    assert len(controls) == 2 * 4 * len(CONTROL_ANSWERS)  # and the same for the controls of the 4 harmful items
    assert results[0].target_engine.kind == "openai" and results[0].target_engine.base_url == target.base_url


def test_rejected_key_stops_the_cli_run_with_exit_2(fake, tmp_path, monkeypatch):
    import yaml

    monkeypatch.setenv("TEST_API_KEY", "sk-wrong")
    target = fake(always=("status", 401))
    config = _run_config(tmp_path, api(target, api_key_env="TEST_API_KEY"), api(fake()))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2 and "refused the request (401)" in " ".join(result.output.split())
    assert len(target.requests) <= 16
    assert "sk-wrong" not in (tmp_path / "run" / "manifest.json").read_text()
