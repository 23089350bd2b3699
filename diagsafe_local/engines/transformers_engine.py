"""The fallback engine for machines without vLLM: Hugging Face transformers, with outlines enforcing the
judge's output constraint (JSON schema, choice list or regular expression). Same interface and records
as the other engines; much slower (one request at a time, no paged attention), so use it for small
runs, laptops and nodes where vLLM does not install.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.core.model_files import load_format
from diagsafe_local.engines.base import (
    Completion,
    EngineBase,
    EngineInfo,
    GenerationRequest,
    error_completion,
    label_logprobs,
    label_token_ids,
    local_model_path,
    release_memory,
)
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.identity import model_fingerprint, package_versions
from diagsafe_local.engines.template_arguments import (
    check_mistral_arguments,
    check_template_arguments,
    mistral_version,
)

# outlines' default JSON grammar allows unbounded whitespace, the same loop vLLM avoids with
# disable_any_whitespace; at most one space between tokens keeps replies compact and finite.
COMPACT_WHITESPACE = r"[ ]?"


# transformers' class for a tekken.json tokenizer: 5's name, then 4.54-4.57's (older ones have no such module)
_MISTRAL_COMMON_CLASSES = ("MistralCommonBackend", "MistralCommonTokenizer")


def _renders_with_mistral_common(tokenizer: Any) -> bool:
    """transformers' tokenizer for a folder with Mistral's tekken.json: mistral_common renders its chats, with no
    template (its get_chat_template raises NotImplementedError by design)."""
    try:
        import transformers.tokenization_mistral_common as module
    except ImportError:  # a transformers before 4.54, or one without mistral_common: no such tokenizer
        return False
    classes = tuple(getattr(module, name) for name in _MISTRAL_COMMON_CLASSES if hasattr(module, name))
    return isinstance(tokenizer, classes)


def _rendered_template(tokenizer: Any, template: str | None) -> str:
    """The template apply_chat_template renders with: the given one, else the tokenizer's (its "default" where it
    has named ones: tokenizer_config's list, additional_chat_templates/); "" where there is none."""
    try:
        return str(tokenizer.get_chat_template(template))
    except ValueError:  # no template at all
        return ""


class TransformersEngine(EngineBase):
    """transformers `generate` (plain) and outlines (schema-constrained) behind the Engine interface."""

    def __init__(self, config: EngineConfig, *, template_arguments: Mapping[str, str] | None = None, **_: Any) -> None:
        """`template_arguments`: those of every judge that renders through this engine, each with the judge that
        sends it (default: `config`'s own)."""
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError:
            raise MissingDependencyError("transformers", "hf", "The transformers engine") from None
        dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            config.dtype
        )
        if dtype is None:
            raise DiagsafeError(f"engine '{config.model}': unsupported dtype '{config.dtype}'")
        local_model_path(config.model)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(
                config.model, revision=config.revision, trust_remote_code=config.trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise DiagsafeError(f"could not load '{config.model}' with transformers: {exc}") from None
        template = Path(config.chat_template).read_text() if config.chat_template else None
        self._template = template
        mistral = _renders_with_mistral_common(self._tokenizer)
        rendered = "" if mistral else _rendered_template(self._tokenizer, template)
        arguments = config.template_arguments() if template_arguments is None else template_arguments
        # apply_chat_template, like vLLM, drops a keyword argument its template does not read
        if mistral:
            check_mistral_arguments(mistral_version(self._tokenizer), arguments, f"the tokenizer of '{config.model}'")
        else:
            where = (
                f"the chat template {config.chat_template}" if template else f"the chat template of '{config.model}'"
            )
            check_template_arguments(rendered, arguments, where)
        try:
            self._model = AutoModelForCausalLM.from_pretrained(
                config.model, revision=config.revision, torch_dtype=dtype, trust_remote_code=config.trust_remote_code
            ).eval()
        except (OSError, ValueError) as exc:
            raise DiagsafeError(f"could not load '{config.model}' with transformers: {exc}") from None
        if config.lora:
            from peft import PeftModel

            self._model = PeftModel.from_pretrained(self._model, config.lora).eval()
        self._outlines_model: Any = None
        self._generators: dict[str, Any] = {}

        self.calls = 0
        self.info = EngineInfo(
            kind="transformers",
            model=config.model,
            revision=config.revision,
            lora=getattr(config, "lora", None),
            model_hash=model_fingerprint(config.model, load_format(config)),
            chat_template_hash="sha256:" + hashlib.sha256(rendered.encode()).hexdigest(),
            versions=package_versions("transformers", "torch", "outlines"),
        )

    def _prompt(self, request: GenerationRequest) -> str:
        if request.prompt is not None:
            return request.raw_prompt()
        continuing = request.assistant_prefix is not None
        return self._tokenizer.apply_chat_template(  # type: ignore[return-value]
            request.chat(),
            tokenize=False,
            add_generation_prompt=not continuing,
            continue_final_message=continuing,
            chat_template=self._template,
            **(request.chat_template_kwargs or {}),
        )

    def _constrained(self, constraint: dict[str, Any]) -> Any:
        import json

        key = json.dumps(constraint, sort_keys=True)
        if key not in self._generators:
            import outlines
            from outlines.types import Choice, JsonSchema, Regex

            if self._outlines_model is None:
                self._outlines_model = outlines.from_transformers(self._model, self._tokenizer)  # type: ignore[arg-type]
            output: Any
            if "json" in constraint:
                output = JsonSchema(constraint["json"], whitespace_pattern=COMPACT_WHITESPACE)
            elif "choice" in constraint:
                output = Choice(constraint["choice"])
            else:
                output = Regex(constraint["regex"])
            self._generators[key] = outlines.Generator(self._outlines_model, output)
        return self._generators[key]

    def _label_logprobs(self, prompt_ids: Any, words: tuple[str, ...]) -> dict[str, float]:
        """Log-probabilities of the label words as the first generated token (one forward step)."""
        import torch

        with torch.inference_mode():
            logits = self._model(prompt_ids).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        ids = label_token_ids(self._tokenizer, words)
        return label_logprobs(ids, {i: float(logprobs[i]) for v in ids.values() for i in v})

    def _one(self, request: GenerationRequest) -> Completion:
        import torch

        prompt = self._prompt(request)
        # A raw prompt leaves special tokens (BOS) to the tokenizer, as vLLM does; a rendered chat has them.
        prompt_ids = self._tokenizer(
            prompt, add_special_tokens=request.prompt is not None, return_tensors="pt"
        ).input_ids
        sampling: dict[str, Any] = {"max_new_tokens": request.max_tokens}
        if request.temperature > 0:
            sampling.update(do_sample=True, temperature=request.temperature, top_p=request.top_p)
            if request.seed is not None:
                torch.manual_seed(request.seed)
        else:
            sampling["do_sample"] = False
        labels = self._label_logprobs(prompt_ids, request.label_words) if request.label_words else None
        if request.constraint is not None:
            text = self._constrained(request.constraint)(prompt, **sampling)
            n_new = len(self._tokenizer(text, add_special_tokens=False).input_ids)
            finish = "length" if n_new >= request.max_tokens else "stop"
        else:
            if request.stop:
                sampling.update(stop_strings=list(request.stop), tokenizer=self._tokenizer)
            with torch.inference_mode():
                out = self._model.generate(prompt_ids, pad_token_id=self._tokenizer.pad_token_id, **sampling)[0]
            new = out[prompt_ids.shape[1] :]
            eos = self._tokenizer.eos_token_id
            stopped = len(new) > 0 and int(new[-1]) == eos
            n_new = len(new)
            text = self._tokenizer.decode(new, skip_special_tokens=request.skip_special_tokens)
            for marker in request.stop:  # generate() keeps the stop string; vLLM and the API drop it
                if marker in text:
                    text, stopped = text[: text.index(marker)], True
            finish = "stop" if stopped or n_new < request.max_tokens else "length"
        return Completion(
            text=text,
            finish_reason=finish,
            prompt_tokens=int(prompt_ids.shape[1]),
            completion_tokens=n_new,
            label_logprobs=labels,
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Each request in turn; a failure becomes that request's error completion."""
        self.calls += 1
        results = []
        for request in requests:
            try:
                results.append(self._one(request))
            except Exception as exc:  # one bad request must not lose the batch
                results.append(error_completion(f"{type(exc).__name__}: {exc}"))
        return results

    def close(self) -> None:
        self._generators.clear()
        self._outlines_model = None
        del self._model
        release_memory(on_cuda=False)  # its model is loaded on the CPU
