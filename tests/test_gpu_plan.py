"""GPU planning (the decision, on CPU) and data-parallel replicas (real processes, on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import GIB, plan_gpus, weight_bits, weight_bytes
from diagsafe_local.engines.host import Host
from diagsafe_local.evaluation.attack.pair import PairConfig
from diagsafe_local.evaluation.config import RunConfig
from diagsafe_local.evaluation.planning import plan_run
from diagsafe_local.runs.manifest import Manifest
from diagsafe_local.runs.records import read_results
from diagsafe_local.selftest import synthetic_items

H100 = 80 * GIB


def engine(model: str, **extra) -> EngineConfig:
    return EngineConfig(model=model, **extra)


def plan(gpus: int, target: int, judge: int, mode: str = "colocate", n_items: int | None = None, **extra):
    sizes = {"t": target, "j": judge}
    return plan_gpus([H100] * gpus, [engine("t", **extra)], engine("j"), mode, 0.45, 0.45, n_items, sizes)


def test_models_that_fit_one_gpu_get_one_replica_per_gpu():
    chosen = plan(8, 15 * GIB, 15 * GIB)
    assert (chosen.replicas, chosen.gpus_per_replica) == (8, 1)
    assert [e.tensor_parallel_size for e in chosen.engines] == [1, 1]


def test_a_large_judge_is_sharded_and_the_node_holds_fewer_replicas():
    sequential = plan(8, 15 * GIB, 140 * GIB, mode="sequential")  # 140 GiB > 0.6 * 0.9 * 80 * 2
    assert sequential.tensor_parallel("judge") == 4 and sequential.tensor_parallel("target:t") == 1
    assert (sequential.replicas, sequential.gpus_per_replica) == (2, 4)
    colocated = plan(8, 15 * GIB, 140 * GIB)  # the judge has 45% of each GPU: 8 of them
    assert (colocated.tensor_parallel("judge"), colocated.replicas) == (8, 1)


def test_a_model_larger_than_the_visible_gpus_is_refused_with_the_arithmetic():
    with pytest.raises(DiagsafeError, match=r"judge j needs 8 GPUs of 80 GiB .* 4 are visible; placement sequential"):
        plan(4, 15 * GIB, 140 * GIB)


def test_configured_tensor_parallel_is_a_minimum_and_leftover_gpus_are_named():
    chosen = plan(6, 15 * GIB, 15 * GIB, tensor_parallel_size=4)
    assert chosen.tensor_parallel("target:t") == 4 and chosen.replicas == 1
    assert any("2 of 6 GPUs stay idle" in note for note in chosen.notes)


def test_replicas_never_outnumber_items_and_cpu_runs_one_process():
    assert plan(8, GIB, GIB, n_items=3).replicas == 3
    cpu = plan(0, 140 * GIB, 140 * GIB)
    assert (cpu.replicas, cpu.tensor_parallel("judge")) == (1, 1)


def test_api_targets_take_no_gpu_and_other_engines_cannot_shard():
    chosen = plan_gpus(
        [H100] * 2,
        [engine("t", kind="openai", base_url="http://x/v1")],
        engine("j"),
        "sequential",
        0.45,
        0.45,
        None,
        {"j": GIB},
    )
    assert [e.role for e in chosen.engines] == ["judge"]
    with pytest.raises(DiagsafeError, match="engine kind 'transformers' cannot shard it"):
        plan_gpus(
            [H100] * 4, [engine("t", kind="transformers")], None, "sequential", 0.45, 0.45, None, {"t": 200 * GIB}
        )


def test_submit_asks_slurm_for_no_gpu_where_every_model_is_behind_an_api(tmp_path):
    from typer.testing import CliRunner

    from diagsafe_local.cli import app

    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a", "prompt": "q"}\n')
    served = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}
    asked = {}
    for name, judge in (("api", {"model": "j", **served}), ("local", {"model": "Qwen2.5-7B-Instruct"})):
        config = tmp_path / f"{name}.yaml"
        config.write_text(
            yaml.safe_dump(
                {"dataset": {"path": str(items)}, "target": {"model": "t", **served}, "judge": judge,
                 "output_dir": str(tmp_path / name)}
            )
        )  # fmt: skip
        dry = CliRunner().invoke(app, ["submit", str(config), "--shards", "2", "--dry-run"])
        assert dry.exit_code == 0, dry.output
        array = dry.output.splitlines()[0]  # the array job's sbatch line
        asked[name] = array.split("--gpus=")[1].split()[0] if "--gpus=" in array else None
    assert asked == {"api": None, "local": "1"}  # an API-only job asks for no GPU at all (some sites refuse --gpus=0)


def test_weight_sizes_come_from_files_then_the_name(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert weight_bytes(str(tmp_path)) == (1000, "weight files")
    assert weight_bytes("Qwen/Qwen2.5-72B-Instruct") == (144 * 10**9, "name, as 16-bit weights")
    assert weight_bytes("meta-llama/Llama-3.1-8B-Instruct")[0] == 16 * 10**9
    assert weight_bytes(str(tmp_path / "step-12000")) == (None, "unknown")


def test_device_groups_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    from diagsafe_local.engines.gpus import visible_devices

    chosen = plan(4, GIB, 70 * GIB, mode="sequential")  # 70 GiB: two GPUs of 43 GiB for weights
    assert chosen.device_groups(visible_devices(4)) == ["3,5", "6,7"]


def run_config(tmp_path: Path, **placement) -> RunConfig:
    return RunConfig.model_validate(
        {
            "dataset": {"path": str(tmp_path / "items.jsonl")},
            "target": {"model": "t", "name": "t"},
            "judge": {"model": "j"},
            "placement": {"mode": "sequential", **placement},
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_explicit_replicas_split_the_gpus_and_are_checked(tmp_path, monkeypatch):
    from diagsafe_local.engines import gpu_plan

    sizes = {"t": GIB, "j": 70 * GIB}
    monkeypatch.setattr(gpu_plan, "weight_bytes", lambda model, bits: (sizes[model], "test"))
    two = plan_run(run_config(tmp_path, replicas=2), None, [H100] * 8)
    assert (two.replicas, two.gpus_per_replica) == (2, 4)
    with pytest.raises(DiagsafeError, match="placement.replicas 5 needs 10 GPUs"):
        plan_run(run_config(tmp_path, replicas=5), None, [H100] * 8)
    one = plan_run(run_config(tmp_path, replicas=2), None, [H100] * 8, replicate=False)
    assert one.replicas == 1 and one.tensor_parallel("judge") == 2


def opened_with(chosen, *opens) -> dict[str, int]:
    """The tensor parallel size each `open(host)` of a host with plan `chosen` asks its engine for, by model (the
    engine itself is never started)."""
    opened = {}

    def factory(config, **options):
        opened[config.model] = config.tensor_parallel_size
        raise RuntimeError("stop after recording")

    host = Host("sequential", 0.45, 0.45, factory, plan=chosen)
    for open_engine in opens:
        with pytest.raises(RuntimeError, match="stop after recording"):
            open_engine(host)
    return opened


def test_the_host_opens_each_engine_with_its_planned_tensor_parallel_size():
    chosen = plan(8, 15 * GIB, 140 * GIB, mode="sequential")
    opened = opened_with(
        chosen,
        lambda host: host.open_target("target:t", engine("t")),
        lambda host: host.open_judge(engine("j"), "xgrammar"),
    )
    assert opened == {"t": 1, "j": 4}


def test_an_attackers_own_model_is_planned_and_opened_with_its_tensor_parallel_size(tmp_path, monkeypatch):
    from diagsafe_local.engines import gpu_plan

    sizes = {"t": 15 * GIB, "j": 15 * GIB, "a": 16 * GIB}  # a: 16 GiB > 0.6 x 20% of 80 GiB
    monkeypatch.setattr(gpu_plan, "weight_bytes", lambda model, bits: (sizes[model], "test"))
    config = run_config(tmp_path, mode="colocate", target_memory=0.35, judge_memory=0.35)
    attacked = config.model_copy(update={"attack": PairConfig(strategy="pair", attacker={"model": "a"})})
    chosen = plan_run(attacked, None, [H100] * 8)
    assert chosen.tensor_parallel("attacker") == 2 and chosen.engines[-1].memory_share == 0.2
    assert (chosen.replicas, chosen.gpus_per_replica) == (4, 2)  # alone, target and judge fit one GPU each
    assert plan_run(config, None, [H100] * 8).gpus_per_replica == 1
    shared = config.model_copy(update={"attack": PairConfig(strategy="pair")})  # the judge's engine attacks
    assert [e.role for e in plan_run(shared, None, [H100] * 8).engines] == ["target:t", "judge"]
    sizes["a"] = 70 * GIB
    with pytest.raises(DiagsafeError, match="attacker a needs 8 GPUs .* 4 are visible; an attack keeps every model"):
        plan_run(attacked, None, [H100] * 4)  # not "placement sequential": an attack cannot run sequentially
    sizes["j"] = 70 * GIB
    with pytest.raises(DiagsafeError, match="judge j needs 8 GPUs .* 4 are visible; an attack keeps every model"):
        plan_run(shared, None, [H100] * 4)
    assert opened_with(chosen, lambda host: host.open_attacker(EngineConfig(model="a"), 0.2, "xgrammar")) == {"a": 2}


@pytest.mark.slow
def test_replicas_run_as_shard_processes_and_merge(tiny_models, tmp_path):
    """Two replicas on the CPU: two real `run --shard` processes, merged into the run directory; a rerun
    finds every shard complete and only merges."""
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps(i) + "\n" for i in synthetic_items(6)))
    engine_settings = {"kind": "transformers", "dtype": "float32"}
    config = {
        "dataset": {"path": str(items)},
        "target": {
            **engine_settings,
            "model": str(tiny_models["target"]),
            "name": "tiny",
            "sampling": {"max_tokens": 8},
        },
        "judge": {**engine_settings, "model": str(tiny_models["judge"]), "sampling": {"max_tokens": 300}},
        "placement": {"replicas": 2},
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "diagsafe_local.cli", "run", str(path)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "2 shards over 2 replicas" in first.stdout and "shard 1/2 finished" in first.stdout
    shards = sorted((tmp_path / "run" / "shards").glob("shard-*-of-0002"))
    assert len(shards) == 2 and all((s / "results.jsonl").is_file() for s in shards)
    merged = read_results(tmp_path / "run" / "results.jsonl")
    per_shard = [read_results(s / "results.jsonl") for s in shards]
    assert all(per_shard) and len(merged) == sum(len(r) for r in per_shard)
    assert {r.item_id for r in merged} == {i["id"] for i in synthetic_items(6)}
    manifest = Manifest.model_validate_json((tmp_path / "run" / "manifest.json").read_text())
    assert manifest.merged_from and len(manifest.merged_from) == 2
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "2 already complete" in again.stdout and "started" not in again.stdout


def test_the_plan_counts_pipeline_stages_and_quantisation():
    judge = EngineConfig(model="meta-llama/Llama-3.1-405B-Instruct")
    # 405B at 16 bits (754 GiB) on 80 GiB GPUs at 60% of 92% each: 16 x 2 stages = 32 GPUs; one node has 8
    staged = judge.model_copy(update={"engine_kwargs": {"pipeline_parallel_size": 2}})
    with pytest.raises(DiagsafeError, match=r"needs 32 GPUs of 80 GiB \(tensor parallel 16 x 2 pipeline stages"):
        plan_gpus([80 * GIB] * 8, [], staged, "sequential", 0.45, 0.45)
    # quantised weights sized from the name: the AWQ 72B is 36 GB, one 80 GiB GPU alone holds it
    assert weight_bits(EngineConfig(model="Qwen/Qwen2.5-72B-Instruct-AWQ")) == 4
    assert weight_bits(EngineConfig(model="m-70B", engine_kwargs={"quantization": "fp8"})) == 8
    quantised = plan_gpus(
        [80 * GIB] * 8, [], EngineConfig(model="Qwen/Qwen2.5-72B-Instruct-AWQ"), "sequential", 0.45, 0.45
    )
    assert quantised.engines[0].tensor_parallel_size == 1 and quantised.engines[0].weight_bytes == 36 * 10**9


# Qwen2.5-7B's and -14B's config.json fields (tests/test_gpu_plan_shapes.py says where each published shape comes
# from, and checks every rule against vLLM building these models)
QWEN25_7B = {"num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064}
QWEN25_14B = {"num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 13824, "vocab_size": 152064}


def shaped(tmp_path: Path, name: str, config: dict, gib: float) -> EngineConfig:
    """A local model of `config`'s shape whose weight file is a sparse file of `gib` GiB."""
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    (model / "model.safetensors").touch()
    os.truncate(model / "model.safetensors", int(gib * GIB))
    return EngineConfig(model=str(model))


def test_twenty_eight_heads_and_four_kv_heads_never_take_seven_gpus(tmp_path):
    """28 heads and 4 KV heads (Qwen2.5-7B) split over 1, 2 or 4 GPUs only: 7 and 14 leave the KV heads uneven,
    28 the vocabulary, so weights that need 5 to 8 GPUs of 16 GiB are refused with vLLM's reasons."""
    from typer.testing import CliRunner

    from diagsafe_local.cli import app

    fits = shaped(tmp_path, "qwen7b-30g", QWEN25_7B, 30)  # 0.6 x 0.92 x 16 GiB = 8.8 GiB of weights per GPU
    assert plan_gpus([16 * GIB] * 8, [], fits, "sequential", 0.45, 0.45).tensor_parallel("judge") == 4
    (tmp_path / "items.jsonl").write_text('{"id": "a", "prompt": "q"}\n')
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"dataset": {"path": str(tmp_path / "items.jsonl")},
             "target": {"model": "t", "kind": "openai", "base_url": "http://127.0.0.1:9/v1"},
             "judge": {"model": str(shaped(tmp_path, "qwen7b-45g", QWEN25_7B, 45).model)},
             "output_dir": str(tmp_path / "run")}
        )
    )  # fmt: skip
    refused = CliRunner().invoke(app, ["plan", str(config), "--gpus", "8", "--gpu-memory", "16"])
    assert refused.exit_code == 2 and "Traceback" not in refused.output, refused.output
    assert "needs at least 6 GPUs of 16 GiB" in refused.output
    assert (
        "vLLM can build it with no tensor parallel size from 6 up (of those that divide its 28 attention heads, "
        "7: its 4 KV heads neither divide by 7 nor divide 7; 14: its 4 KV heads neither divide by 14 nor divide 14; "
        "28: its vocabulary of 152064 (152064 padded to 64) does not divide by 28)"
    ) in refused.output
    for configured, reason in ((8, "its 28 attention heads do not divide by 8"), (7, "its 4 KV heads")):
        with pytest.raises(DiagsafeError, match=f"tensor_parallel_size {configured}: {reason}"):
            chosen = fits.model_copy(update={"tensor_parallel_size": configured})
            plan_gpus([80 * GIB] * 8, [], chosen, "sequential", 0.4, 0.4)


def test_forty_heads_and_eight_kv_heads_never_take_five_gpus(tmp_path):
    """40 heads, 8 KV heads (Qwen2.5-14B/32B) at 36 GiB need 5 GPUs of 16 GiB; 5 divides the heads but not the 8
    KV heads (nor the vocabulary), 6 and 7 not the heads: vLLM loads it on 8."""
    wide = shaped(tmp_path, "qwen14b-36g", QWEN25_14B, 36)
    assert plan_gpus([16 * GIB] * 8, [], wide, "sequential", 0.45, 0.45).tensor_parallel("judge") == 8


def test_sleep_mode_plans_at_the_share_its_engines_run_at(tmp_path, monkeypatch):
    """Sleep mode's engines run at 0.8 of each GPU (placement's default there), not vLLM's 0.92: 40 GiB of weights
    fit 0.6 x 0.92 x 80 GiB on one GPU but not 0.6 x 0.8 x 80 GiB; an engine's own gpu_memory_utilization rules."""
    from diagsafe_local.engines import gpu_plan

    sizes = {"t": GIB, "j": 40 * GIB}
    monkeypatch.setattr(gpu_plan, "weight_bytes", lambda model, bits: (sizes[model], "test"))
    asleep = plan_run(run_config(tmp_path, mode="sleep"), None, [H100] * 8)
    judge = next(e for e in asleep.engines if e.role == "judge")
    assert (judge.memory_share, judge.tensor_parallel_size) == (0.8, 2)
    assert plan_run(run_config(tmp_path, mode="sequential"), None, [H100] * 8).tensor_parallel("judge") == 1
    own = run_config(tmp_path, mode="sequential")
    own = own.model_copy(update={"judge": own.judge.model_copy(update={"gpu_memory_utilization": 0.5})})
    assert plan_run(own, None, [H100] * 8).tensor_parallel("judge") == 2


def test_an_api_run_is_planned_as_client_processes_that_share_the_endpoints_concurrency(tmp_path, monkeypatch):
    """A Python client keeps a core busy at a few hundred requests a second: an API-only run is split into one
    process per 20,000 requests (at most one per CPU), and together they keep the configured concurrency in
    flight, each its share."""
    import os

    from fakes import ScriptedEngine

    from diagsafe_local.evaluation.planning import REQUESTS_PER_CLIENT, client_processes

    engine = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "concurrency": 64}
    data = {
        "dataset": {"path": str(tmp_path / "items.jsonl")},
        "target": {"model": "t", "name": "t", **engine, "sampling": {"n": 2}},
        "judge": {"model": "j", **engine},
        "output_dir": str(tmp_path / "run"),
    }
    config = RunConfig.model_validate(data)
    cpus = len(os.sched_getaffinity(0))
    per_client = REQUESTS_PER_CLIENT // 4  # items: an answer and a verdict for each of 2 samples
    assert client_processes(config, per_client - 1) == 1  # too little work to be worth a second process
    assert client_processes(config, 2 * per_client) == min(cpus, 2)
    assert client_processes(config, 10**9) == cpus
    assert plan_run(config, 10**9).replicas == cpus
    assert plan_run(config, 10**9, replicate=False).replicas == 1  # a shard's own process runs its share itself
    local = RunConfig.model_validate({**data, "target": {"model": "t", "name": "t"}})
    assert plan_run(local, 10**9).replicas == 1  # vLLM on the CPU: one engine, not one per client

    opened = []

    def factory(config, **options):
        opened.append(config.concurrency)
        return ScriptedEngine(model=config.model)

    host = Host("sequential", 0.45, 0.45, factory, processes=3)
    host.open_target("target:t", config.targets[0])
    host.open_judge(config.judge, "xgrammar")
    assert opened == [22, 22]  # 64 in flight for the run: 22 in each of its 3 processes


def test_plan_says_how_many_client_processes_an_api_run_gets(tmp_path):
    from typer.testing import CliRunner

    from diagsafe_local.cli import app

    (tmp_path / "items.jsonl").write_text("".join(json.dumps({"id": f"q{k}", "prompt": "p"}) + "\n" for k in range(3)))
    engine = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}
    config = {
        "dataset": {"path": str(tmp_path / "items.jsonl")},
        "target": {"model": "t", **engine, "sampling": {"n": 2}},
        "judge": {"model": "j", **engine},
        "output_dir": str(tmp_path / "run"),
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "run.yaml")])
    assert result.exit_code == 0, result.output
    assert "every model is behind an API: 1 client process(es) for about 12 requests" in result.output


def test_a_jury_members_model_is_planned_alone_and_opened_with_its_tensor_parallel_size(tmp_path, monkeypatch):
    """A member loads alone once the other engines have closed: its tensor parallel size is planned at the whole
    GPU's share (colocated or not), and a replica holds enough GPUs for the largest member."""
    from diagsafe_local.engines import gpu_plan
    from diagsafe_local.evaluation.planning import api_only

    sizes = {"t": 15 * GIB, "j": 15 * GIB, "big": 140 * GIB, "small": 15 * GIB}
    monkeypatch.setattr(gpu_plan, "weight_bytes", lambda model, bits: (sizes[model], "test"))
    config = run_config(tmp_path, mode="colocate")
    jury = {"members": [{"model": "big", "name": "big"}, {"model": "small", "name": "small"}]}
    judged = config.model_copy(update={"judge": config.judge.model_copy(update={"jury": jury})})
    judged = RunConfig.model_validate(judged.model_dump())
    chosen = plan_run(judged, None, [H100] * 8)
    assert chosen.tensor_parallel("jury:big") == 4 and chosen.tensor_parallel("jury:small") == 1
    assert chosen.tensor_parallel("judge") == 1 and chosen.gpus_per_replica == 4 and chosen.replicas == 2
    big = judged.judge.jury.members[0]
    assert opened_with(chosen, lambda host: host.open_juror("big", big, "xgrammar")) == {"big": 4}
    served = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}
    remote = RunConfig.model_validate(
        {**judged.model_dump(), "targets": [{"model": "t", "name": "t", **served}],
         "judge": {"model": "j", **served, "jury": jury}}
    )  # fmt: skip
    assert not api_only(remote)  # a member's local model needs the node's GPUs


# Qwen2.5-72B-Instruct-AWQ's config.json as published on the hub (its fields that decide the split): Qwen padded
# the intermediate size from 29568 to 29696 in its AWQ/GPTQ releases so that each GPU's share of down_proj's input
# is a multiple of the 128-wide quantisation groups.
QWEN_72B_AWQ = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 29696,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm", "zero_point": True},
}


def test_a_quantised_models_groups_must_align_with_each_gpus_share_of_a_row_parallel_input(tmp_path):
    """vLLM's AWQ/GPTQ/Marlin kernels refuse a row-parallel layer whose input per GPU is not a multiple of the group
    size (quantization/auto_awq.py BaseAWQLinearMethod.create_weights, utils/marlin_utils.py
    verify_marlin_supports_shape)."""
    from diagsafe_local.engines.gpu_plan import expert_parallel, model_shape

    def shape(name: str, **changes):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps({**QWEN_72B_AWQ, **changes}))
        found = model_shape(str(path))
        assert found is not None
        return found

    published = shape("published")
    assert [published.refusal(tp) for tp in (1, 2, 4, 8)] == [None] * 4
    unpadded = shape("unpadded", intermediate_size=29568)  # the bf16 model's width, quantised as is
    assert unpadded.refusal(1) is None
    assert (
        unpadded.refusal(2)
        == "its down_proj input per GPU (29568 / 2 = 14784) is not a multiple of its 128-wide quantisation groups"
    )
    assert unpadded.refusal(8) is not None
    channelwise = shape("channelwise", intermediate_size=29568, quantization_config={"group_size": -1})
    assert channelwise.refusal(8) is None
    # o_proj's input is the attention width (heads x head_dim): 64 x 128 over 8 GPUs is 1024, over 16 would be 512
    narrow = shape("narrow", head_dim=12, quantization_config={"group_size": 128})  # 64 x 12 = 768: 96 per GPU at 8
    assert "o_proj input per GPU (768 / 8 = 96)" in (narrow.refusal(8) or "")
    # experts: their width is split over the GPUs, but not under expert parallelism (fused_moe/config.py)
    moe = shape("moe", moe_intermediate_size=1408, quantization_config={"group_size": 128})
    assert "moe_intermediate_size" in (moe.refusal(2) or "")  # 704 per GPU
    assert moe.refusal(2, expert_parallel=True) is None
    assert expert_parallel(engine("m", engine_kwargs={"enable_expert_parallel": True})) and not expert_parallel(
        engine("m")
    )
