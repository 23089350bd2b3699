"""A sequence classifier behind the Engine interface (GPTFuzzer's RoBERTa and the like): each request's
raw `prompt` is the text to classify; the completion's text is the predicted class index and its
`label_logprobs` the log-probability of every class, keyed by class index ("0", "1", ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.core.model_files import load_format
from diagsafe_local.engines.base import (
    Completion,
    EngineBase,
    EngineInfo,
    GenerationRequest,
    error_completion,
    local_model_path,
    release_memory,
)
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.gpus import cuda_available
from diagsafe_local.engines.identity import model_fingerprint, package_versions

BATCH = 32


class ClassifierEngine(EngineBase):
    """transformers `AutoModelForSequenceClassification`, batched, truncating to the model's length."""

    def __init__(self, config: EngineConfig, **_: Any) -> None:
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError:
            raise MissingDependencyError("transformers", "hf", "The classifier engine") from None
        local_model_path(config.model)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(config.model, revision=config.revision)
            self._model = AutoModelForSequenceClassification.from_pretrained(
                config.model, revision=config.revision
            ).eval()
        except (OSError, ValueError) as exc:
            raise DiagsafeError(f"could not load classifier '{config.model}': {exc}") from exc
        self._device = "cuda" if cuda_available() else "cpu"
        self._model.to(self._device)
        self._max_length = min(int(getattr(self._tokenizer, "model_max_length", 512) or 512), 512)
        self._torch = torch
        self.calls = 0
        self.info = EngineInfo(
            kind="classifier",
            model=config.model,
            revision=config.revision,
            model_hash=model_fingerprint(config.model, load_format(config)),
            chat_template_hash=None,
            versions=package_versions("transformers", "torch"),
            details={"labels": {str(k): v for k, v in self._model.config.id2label.items()}},
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Classify each request's prompt (chat requests are errors: a classifier reads one text)."""
        self.calls += 1
        results: list[Completion | None] = [None] * len(requests)
        texts = [(k, r.prompt) for k, r in enumerate(requests) if r.prompt is not None]
        for k, r in enumerate(requests):
            if r.prompt is None:
                results[k] = error_completion("a classifier engine classifies a raw prompt, not a chat")
        for start in range(0, len(texts), BATCH):
            chunk = texts[start : start + BATCH]
            encoded = self._tokenizer(
                [t for _, t in chunk], padding=True, truncation=True, max_length=self._max_length, return_tensors="pt"
            ).to(self._device)
            with self._torch.inference_mode():
                logprobs = self._torch.log_softmax(self._model(**encoded).logits.float(), dim=-1).cpu()
            lengths = encoded["attention_mask"].sum(dim=1).tolist()
            for (k, _), row, n in zip(chunk, logprobs, lengths):
                results[k] = Completion(
                    text=str(int(row.argmax())),
                    finish_reason="stop",
                    prompt_tokens=int(n),
                    label_logprobs={str(i): float(v) for i, v in enumerate(row)},
                )
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Drop the model and give its memory back: it lives in this process, on CUDA where there is one (a vLLM
        engine's lives in its own processes), and the next engine needs it free."""
        if self.__dict__.pop("_model", None) is not None:
            release_memory(self._device == "cuda")
