"""The planner's tensor parallel sizes against vLLM itself, on the shapes of published models.

vLLM builds each model here (on the meta device: no memory, no GPU) with every tensor parallel size a node of 8
GPUs offers, its distributed groups stubbed to that size; what it builds is what it loads. The planner must pick,
for weights that need n GPUs, the smallest size from n up that vLLM builds, and refuse when there is none.

Where each shape comes from (the fields of the model repository's config.json; Hugging Face repositories are not
in the code index, so each was read from a public copy of that config.json, found with the code search):
- Qwen2.5-0.5B: rwth-i6/i6_experiments users/juanola/experiments/e25_11_13_ctc/configurations/qwen2/qwen2_configs.py
  (Qwen2-0.5B's config.json, the same shape; Abandon-ht/LLM-tutorial
  docs/source/model_pages/qwen2.5-0.5b-instruct.rst: "14 for Q and 2 for KV").
- Qwen2.5-1.5B: 1536 hidden, 12 heads, 2 KV heads, 8960, 151936, as quoted from its config.json in public code
  (and ZHUI/paddlenlp_model_readme Qwen/Qwen2.5-Coder-1.5B/index.md: "12 for Q and 2 for KV").
- Qwen2.5-3B, -7B, -14B, -32B, Llama-3.1-8B, Qwen3-30B-A3B: citsjtu2020/LLM-Prof sglang/Model_Config.md (their
  config.json files, copied whole).
- Qwen2.5-72B: the hf_config of Qwen/Qwen2.5-72B-Instruct-AWQ quoted in a public models.json design note
  (64 heads, 8 KV heads, 29568, 152064), the same in the vLLM-style test fixture QWEN2_HF.
- Llama-3.1-70B: LLAMA_3_1_70B_CONFIG of a public hf_sync test (64 heads, 8 KV heads, 28672, 128256), the same as
  meta-llama/Llama-3.3-70B-Instruct's config.json quoted in a public write-up.
- Mistral-7B-v0.1: MISTRAL_SLIDING_HF of a public test (32 heads, 8 KV heads, 14336, 32000).
- Gemma-2-9B and -27B: NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/gemma/test_gemma2_bridge.py (their
  config.json fields); AI-Hypercomputer/maxtext MaxText/utils/ckpt_conversion/utils/hf_model_configs.py agrees.
- Mixtral-8x7B: MIXTRAL_HF of the same public test as Mistral, and a MixtralConfig dump of
  mistralai/Mixtral-8x7B-Instruct-v0.1 (32 heads, 8 KV heads, experts' 14336, 8 experts, 32000).
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

import pytest

from diagsafe_local.core.errors import DiagsafeError
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpu_plan import ALONE_SHARE, GIB, WEIGHT_SHARE, model_shape, plan_gpus

GPUS = 8
GPU_MEMORY = 16 * GIB
PER_GPU = WEIGHT_SHARE * ALONE_SHARE * GPU_MEMORY  # weights one GPU holds when its engine has it alone


def qwen2(hidden: int, heads: int, kv: int, intermediate: int, vocab: int, layers: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "num_hidden_layers": layers,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": vocab == 151936,
        "torch_dtype": "bfloat16",
    }


def llama(hidden: int, heads: int, kv: int, intermediate: int, vocab: int, layers: int, **more: Any) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "num_hidden_layers": layers,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **more,
    }


def gemma2(hidden: int, heads: int, kv: int, head_dim: int, intermediate: int, layers: int) -> dict[str, Any]:
    return {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "vocab_size": 256000,
        "num_hidden_layers": layers,
        "max_position_embeddings": 8192,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh",
        "torch_dtype": "bfloat16",
    }


PUBLISHED = {
    "Qwen2.5-0.5B": qwen2(896, 14, 2, 4864, 151936, 24),
    "Qwen2.5-1.5B": qwen2(1536, 12, 2, 8960, 151936, 28),
    "Qwen2.5-3B": qwen2(2048, 16, 2, 11008, 151936, 36),
    "Qwen2.5-7B": qwen2(3584, 28, 4, 18944, 152064, 28),
    "Qwen2.5-14B": qwen2(5120, 40, 8, 13824, 152064, 48),
    "Qwen2.5-32B": qwen2(5120, 40, 8, 27648, 152064, 64),
    "Qwen2.5-72B": qwen2(8192, 64, 8, 29568, 152064, 80),
    "Llama-3.1-8B": llama(4096, 32, 8, 14336, 128256, 32),
    "Llama-3.1-70B": llama(8192, 64, 8, 28672, 128256, 80),
    "Mistral-7B-v0.1": {
        **llama(4096, 32, 8, 14336, 32000, 32, sliding_window=4096),
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
    },
    "Gemma-2-9B": gemma2(3584, 16, 8, 256, 14336, 42),
    "Gemma-2-27B": gemma2(4608, 32, 16, 128, 36864, 46),
    "Mixtral-8x7B": {
        **llama(4096, 32, 8, 14336, 32000, 32, num_local_experts=8, num_experts_per_tok=2, head_dim=128),
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
    },
    "Qwen3-30B-A3B": {
        **qwen2(2048, 32, 4, 6144, 151936, 48),
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "head_dim": 128,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
}


def group_of(size: int) -> types.SimpleNamespace:
    """A stand-in for one of vLLM's process groups, as rank 0 of `size` processes sees it."""
    ranks = types.SimpleNamespace(size=lambda: size)
    return types.SimpleNamespace(
        world_size=size, rank_in_group=0, rank=0, is_first_rank=True, is_last_rank=True, device_group=ranks
    )


def vllm_builds(model: Path) -> dict[int, str | None]:
    """vLLM's own verdict on each tensor parallel size of 1 to GPUS: None where it builds the model, else its
    error. The model is built on the meta device with vLLM's tensor (and expert) parallel groups stubbed to the
    size, and one pipeline stage, data parallel and context parallel rank, so every divisibility check vLLM makes while building its layers runs as on GPUs."""
    import torch
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader.utils import initialize_model

    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="bfloat16")
    alone = group_of(1)
    verdicts: dict[int, str | None] = {}
    for tp in range(1, GPUS + 1):
        group = group_of(tp)
        try:
            with (
                pytest.MonkeyPatch.context() as patch,
                set_current_vllm_config(
                    config := VllmConfig(
                        model_config=model_config, parallel_config=ParallelConfig(tensor_parallel_size=tp)
                    )
                ),
                torch.device("meta"),
            ):
                for name, size in (("_TP", group), ("_EP", group), ("_PP", alone), ("_DP", alone), ("_PCP", alone)):
                    patch.setattr(parallel_state, name, size)
                initialize_model(vllm_config=config)
            verdicts[tp] = None
        except (AssertionError, ValueError) as refused:  # pydantic's ValidationError is a ValueError
            verdicts[tp] = [line for line in str(refused).splitlines() if "errors.pydantic.dev" not in line][-1]
    return verdicts


def local_model(root: Path, name: str, config: dict[str, Any]) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_planner_picks_only_sizes_vllm_builds_for_published_shapes(name, tmp_path):
    pytest.importorskip("vllm")
    config = PUBLISHED[name]
    (tmp_path / "vllm").mkdir()
    verdicts = vllm_builds(local_model(tmp_path / "vllm", name, config))  # config.json alone: no weights to read
    built = [tp for tp, refused in verdicts.items() if refused is None]
    assert built and built[0] == 1, verdicts  # every published model loads on one GPU
    model = local_model(tmp_path, name, config)
    shape = model_shape(str(model))
    assert shape is not None
    ours = {tp: shape.refusal(tp) for tp in verdicts}
    assert [tp for tp, refused in ours.items() if refused is None] == built, f"{name}: {ours} vs vLLM's {verdicts}"
    weights = model / "model.safetensors"
    weights.touch()
    for need in range(1, GPUS + 1):
        os.truncate(weights, int(PER_GPU * (need - 0.5)))  # a sparse file that needs `need` GPUs
        loadable = [tp for tp in built if tp >= need]
        engine = EngineConfig(model=str(model))
        if not loadable:
            with pytest.raises(DiagsafeError, match="vLLM"):
                plan_gpus([GPU_MEMORY] * GPUS, [], engine, "sequential", 0.45, 0.45)
            continue
        chosen = plan_gpus([GPU_MEMORY] * GPUS, [], engine, "sequential", 0.45, 0.45).tensor_parallel("judge")
        assert chosen == loadable[0], f"{name} needs {need} GPUs: planned {chosen}, vLLM builds {built}: {verdicts}"
