"""The one engine interface every backend implements: a batch of requests in, completions out, same order.

Backends sort, chunk and parallelise for themselves; a failed request comes back as a Completion with
`finish_reason="error"` and the error text, never as an exception that loses the rest of the batch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from diagsafe_local.core.messages import Message


class GenerationRequest(BaseModel):
    """One conversation to continue (chat `messages`), or a raw `prompt` already in the model's own format.

    At most one output constraint: `json_schema`, `choices` or `regex`. `label_words` asks for the
    log-probabilities of those words as the first generated token (each word's probability is the sum
    over its tokenisations with and without a leading space). `assistant_prefix` is text the answer already
    starts with (the engine continues it; the completion holds only what follows); `stop` ends the answer at
    the first of these strings (not included in the text, finish reason `stop`). `chat_template_kwargs` are the
    chat template's keyword arguments (a guard's reasoning switch): vLLM drops those its template does not use
    (`renderers/hf.py`, `resolve_chat_template_kwargs`); a raw `prompt` has no template to take them.
    """

    model_config = ConfigDict(frozen=True)

    messages: tuple[Message, ...] = ()
    prompt: str | None = None
    max_tokens: int = Field(ge=1)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None
    regex: str | None = None
    label_words: tuple[str, ...] | None = None
    assistant_prefix: str | None = None
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True  # False: special tokens stay in the text (and `stop` can match them)
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input_one_constraint(self) -> GenerationRequest:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("a request has either messages or a prompt")
        if sum(x is not None for x in (self.json_schema, self.choices, self.regex)) > 1:
            raise ValueError("a request has at most one of json_schema, choices, regex")
        return self

    def chat(self) -> list[dict[str, str]]:
        """The messages as chat dicts, the assistant prefix (if any) as a final assistant message to continue."""
        messages = [m.model_dump() for m in self.messages]
        if self.assistant_prefix is not None:
            messages.append({"role": "assistant", "content": self.assistant_prefix})
        return messages

    def raw_prompt(self) -> str:
        """The raw prompt with the assistant prefix appended (for requests that have a prompt)."""
        return (self.prompt or "") + (self.assistant_prefix or "")

    @property
    def constraint(self) -> dict[str, Any] | None:
        """The output constraint as vLLM's structured-outputs fields, if any."""
        if self.json_schema is not None:
            return {"json": self.json_schema}
        if self.choices is not None:
            return {"choice": list(self.choices)}
        if self.regex is not None:
            return {"regex": self.regex}
        return None


class Completion(BaseModel):
    """What the engine produced for one request. A model's text is hostile input: a lone UTF-16 surrogate in it
    (a server may send `\\ud800`, a valid JSON escape) cannot be written as UTF-8 and becomes U+FFFD."""

    model_config = ConfigDict(frozen=True)

    text: str
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[float] | None = None
    label_logprobs: dict[str, float] | None = None
    error: str | None = None

    @field_validator("text", "error")
    @classmethod
    def _writable(cls, value: str | None) -> str | None:
        return None if value is None else writable_text(value)


def writable_text(text: str) -> str:
    """`text` with every lone surrogate (code points U+D800-U+DFFF: never a character, only half of an escape)
    replaced by U+FFFD, so it can be written as UTF-8."""
    return _SURROGATE.sub("\ufffd", text)


_SURROGATE = re.compile("[\ud800-\udfff]")


class EngineInfo(BaseModel):
    """How an engine is described in manifests and records (never secrets)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    model: str
    revision: str | None = None
    lora: str | None = None
    model_hash: str | None = None
    chat_template_hash: str | None = None
    context_length: int | None = None  # prompt + output tokens the model can hold (None: unknown, e.g. an API)
    versions: dict[str, str] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)


class Engine(Protocol):
    """A chat model behind one batch method; optional features (its own request stream, sleep mode) answer
    "not here" by default (see `EngineBase`), and an engine kind declares which it has (`engines.kinds`)."""

    info: EngineInfo
    calls: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request; results in request order."""
        ...

    def open_stream(self) -> Any:
        """The engine's own request stream (`engines.streams.Stream`), or None (a batch stream is made)."""
        ...

    def sleep(self) -> bool:
        """Offload the weights while idle (True), where the engine can."""
        ...

    def wake_up(self) -> None:
        """Bring slept weights back."""
        ...

    def close(self) -> None:
        """Free the engine's memory (GPU or CPU)."""
        ...


class EngineBase:
    """What every engine has unless it does better: no stream of its own, no sleep mode."""

    def open_stream(self) -> Any:
        return None

    def sleep(self) -> bool:
        return False

    def wake_up(self) -> None:
        return None


def logsumexp(values: Sequence[float]) -> float:
    """log(sum(exp(v))) over the finite values; -inf when there are none."""
    finite = [v for v in values if v != -math.inf]
    if not finite:
        return -math.inf
    top = max(finite)
    return top + math.log(sum(math.exp(v - top) for v in finite))


def word_variants(word: str) -> tuple[str, str]:
    """A label word as a first answer token may or may not carry a leading space."""
    return (word, " " + word)


def label_token_ids(tokenizer: Any, words: Sequence[str]) -> dict[str, list[int]]:
    """Each word's candidate first-token ids (with and without a leading space); words must not share one."""
    ids = {w: sorted({tokenizer.encode(v, add_special_tokens=False)[0] for v in word_variants(w)}) for w in words}
    shared = set.intersection(*(set(v) for v in ids.values())) if len(ids) > 1 else set()
    if shared:
        raise ValueError(f"label words {tuple(words)} share first tokens {sorted(shared)} in this tokenizer")
    return ids


def label_logprobs(keys: Mapping[str, Sequence[Any]], logprobs: Mapping[Any, float]) -> dict[str, float]:
    """Each label word's log-probability: logsumexp over those of its token keys found in `logprobs`
    (ids, or token texts); a word none of whose tokens is there is left out."""
    out = {}
    for word, candidates in keys.items():
        lp = logsumexp([logprobs[k] for k in candidates if k in logprobs])
        if lp != -math.inf:
            out[word] = lp
    return out


def local_model_path(model: str) -> None:
    """Refuse a model given as a path that does not exist, before an engine takes it for a hub id
    (`./ckpt/step-1200` with a typo would otherwise be "not found on the Hub")."""
    from pathlib import Path

    from diagsafe_local.core.errors import DiagsafeError

    path = Path(model).expanduser()
    looks_local = (
        model.startswith(("/", "./", "../", "~"))
        or model.count("/") > 1
        or (path.parent != Path(".") and path.parent.is_dir())
    )  # "runs/ckpt-12O0" beside an existing runs/
    if looks_local and not path.exists():
        raise DiagsafeError(f"model '{model}': no such file or directory")


def release_memory(on_cuda: bool) -> None:
    """After an in-process engine dropped its model: collect it (modules hold reference cycles) and, on CUDA,
    give the caching allocator's now unused blocks back to the driver, so NVML, and the next engine's wait for
    memory and vLLM's start-up check, see them free (the CUDA context stays until the process ends). cuBLAS's
    workspaces (one per handle and stream, from the caching allocator) stay reserved through `empty_cache()`
    until dropped: torch's own leak check drops them first (torch/testing/_internal/common_utils.py,
    CudaMemoryLeakCheck: `torch._C._cuda_clearCublasWorkspaces()` then `torch.cuda.empty_cache()`). That function
    is private and absent from CPU builds: called where present."""
    import gc

    gc.collect()
    if on_cuda:
        import torch

        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()


def error_completion(message: str) -> Completion:
    return Completion(text="", finish_reason="error", error=message)


class BorrowedEngine(EngineBase):
    """A view of an engine shared by several runs: counts its own calls; close() leaves the engine loaded."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.info = engine.info
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.calls += 1
        return self._engine.generate(requests)

    def open_stream(self) -> Any:
        """The shared engine's own stream; None where it has none (a batch stream is made instead)."""
        self.calls += 1
        return self._engine.open_stream()

    def close(self) -> None:
        """Leave the shared engine to its owner."""
