"""The API engine: OpenAI-compatible chat completions (a vLLM server, a hosted judge, a commercial API).

Requests stream (`OpenAIStream`): each goes out as it is submitted and comes back as it finishes, at most
`concurrency` in flight, through one HTTP client (and connection pool) that the engine keeps for its
lifetime on a private event loop. 429, 5xx, time-outs, connection errors and
malformed bodies are retried with exponential backoff and full jitter, honouring `Retry-After` up to
`backoff_max` (and never past the request timeout); a request
that still fails comes back as an error completion and the run goes on (a rerun retries it). A rejected
API key or an unknown model stops the run at once with one clear error. Judge replies are constrained
with `response_format` json_schema, or vLLM's `structured_outputs` choice/regex extension (servers may
ignore either silently, so the judge validates every reply). Raw prompts (judges with their own format)
go to the completions endpoint; P(Yes) comes from the first position's top-20 log-probabilities.
The key is read from the environment variable named in the config and never written anywhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import random
import threading
from collections.abc import Coroutine, Hashable, Sequence
from typing import Any, TypeVar

from diagsafe_local.core.errors import DiagsafeError, MissingDependencyError
from diagsafe_local.engines.base import (
    Completion,
    EngineBase,
    EngineInfo,
    GenerationRequest,
    error_completion,
    label_logprobs,
    word_variants,
)
from diagsafe_local.engines.config import EngineConfig
from diagsafe_local.engines.identity import package_versions
from diagsafe_local.engines.streams import run_all

T = TypeVar("T")
POLL_WAIT = 0.05  # seconds a poll waits for the first reply to finish (callers loop while requests are pending)


class FatalAPIError(DiagsafeError):
    """The endpoint refuses every request (bad key, no such model): retrying cannot help."""


TOP_LOGPROBS = 20


def _token_logprobs(logprobs: Any, chat: bool) -> list[tuple[float, dict[str, float]]]:
    """(logprob of the generated token, {token text: logprob} of the top alternatives) per position."""
    if logprobs is None:
        return []
    if chat:
        return [
            (float(t.logprob), {a.token: float(a.logprob) for a in (t.top_logprobs or [])})
            for t in (logprobs.content or [])
        ]
    tops = logprobs.top_logprobs or [{}] * len(logprobs.token_logprobs or [])
    return [
        (float(lp), {k: float(v) for k, v in (top or {}).items()})
        for lp, top in zip(logprobs.token_logprobs or [], tops)
    ]


def _label_logprobs(
    top: dict[str, float],
    words: tuple[str, ...],
    ids: dict[str, list[int]] | None,
) -> dict[str, float]:
    """Each label word's log-probability over its tokens, named `token_id:N` when the server returned
    ids, else matched by text (with or without a leading space)."""
    names = {w: [f"token_id:{i}" for i in ids[w]] if ids else list(word_variants(w)) for w in words}
    return label_logprobs(names, top)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class OpenAIEngine(EngineBase):
    """OpenAI-compatible chat completions behind the Engine interface."""

    def __init__(self, config: EngineConfig, **_: Any) -> None:
        try:
            import openai  # noqa: F401
        except ImportError:
            raise MissingDependencyError("openai", "api", "The API engine") from None
        if not config.base_url:
            raise DiagsafeError(f"engine '{config.model}': kind 'openai' needs base_url")
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if config.api_key_env and not key:
            raise DiagsafeError(f"engine '{config.model}': environment variable {config.api_key_env} is not set")
        self._key = key or "EMPTY"
        self.config = config
        self._label_ids: dict[tuple[str, ...], dict[str, list[int]] | None] = {}
        self._loop: _Loop | None = None
        self._fatal: FatalAPIError | None = None
        self._client: Any = None
        self._gate: asyncio.Semaphore
        self.calls = 0
        self.info = EngineInfo(
            kind="openai",
            model=config.model,
            versions=package_versions("openai", "httpx"),
            details={"base_url": config.base_url, "concurrency": config.concurrency, "api_key_env": config.api_key_env},
        )

    def _started(self) -> _Loop:
        """The event loop and HTTP client, started on first use and kept until close()."""
        if self._loop is None:
            from openai import AsyncOpenAI

            async def client() -> Any:  # made inside the loop that will use it
                return AsyncOpenAI(
                    base_url=self.config.base_url, api_key=self._key, max_retries=0, timeout=self.config.timeout
                )

            loop = _Loop()
            self._client = loop.run(client()).result()
            self._gate = asyncio.Semaphore(self.config.concurrency)
            self._loop = loop
        return self._loop

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future[Completion]:
        """Send one request; its completion arrives on the returned future."""
        loop = self._started()
        words = request.label_words
        if words and words not in self._label_ids:
            self._label_ids[words] = loop.run(self._tokenize_labels(words)).result()
        return loop.run(self._one(self._client, self._gate, request))

    def open_stream(self) -> OpenAIStream:
        """Requests out as they are submitted, completions back as each finishes."""
        self.calls += 1
        return OpenAIStream(self)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """All requests through one stream; results in request order."""
        if not requests:
            return []
        return run_all(self.open_stream(), requests)

    def request_params(self, request: GenerationRequest) -> dict[str, Any]:
        """The arguments of the `create` call that sends `request` (chat or text completions)."""
        params: dict[str, Any] = dict(
            model=self.config.model,
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
        )
        if request.prompt is None:
            params["messages"] = request.chat()
        else:
            params["prompt"] = request.raw_prompt()
        if request.stop:
            params["stop"] = list(request.stop)
        if not request.skip_special_tokens:  # vLLM's server extension
            params["extra_body"] = {**params.get("extra_body", {}), "skip_special_tokens": False}
        if request.prompt is None and request.assistant_prefix is not None:
            # Continue the final assistant message (vLLM's server extension; other servers start a new turn).
            params["extra_body"] = {
                **params.get("extra_body", {}),
                "continue_final_message": True,
                "add_generation_prompt": False,
            }
        if request.prompt is None and request.chat_template_kwargs:
            # The template's keyword arguments, in the body as vLLM's OpenAI server takes them (an extension).
            params["extra_body"] = {
                **params.get("extra_body", {}),
                "chat_template_kwargs": request.chat_template_kwargs,
            }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.json_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": request.json_schema, "strict": True},
            }
        elif request.constraint is not None:
            # vLLM's OpenAI server takes choice/regex constraints in `structured_outputs` (an extension).
            params["extra_body"] = {**params.get("extra_body", {}), "structured_outputs": request.constraint}
        label_ids = self._label_ids.get(request.label_words) if request.label_words else None
        if label_ids:
            # A vLLM server scores exactly these tokens (its `logprob_token_ids` extension), named by id.
            scored = sorted({i for v in label_ids.values() for i in v})
            params["logprobs"] = True if request.prompt is None else len(scored)
            params["extra_body"] = {
                **params.get("extra_body", {}),
                "return_tokens_as_token_ids": True,
                "logprob_token_ids": scored,
            }
        elif request.label_words:
            # Elsewhere the words are matched by text against the first position's 20 most likely tokens.
            params.update(
                {"logprobs": TOP_LOGPROBS}
                if request.prompt is not None
                else {"logprobs": True, "top_logprobs": TOP_LOGPROBS}
            )
        elif self.config.logprobs:
            params["logprobs"] = True if request.prompt is None else 1
        return params

    async def _one(self, client: Any, gate: asyncio.Semaphore, request: GenerationRequest) -> Completion:
        import openai

        params = self.request_params(request)
        label_ids = self._label_ids.get(request.label_words) if request.label_words else None
        create = client.chat.completions.create if request.prompt is None else client.completions.create
        last_error = ""
        for attempt in range(self.config.max_retries + 1):
            wait: float | None = None
            async with gate:
                if self._fatal is not None:  # the endpoint already refused the engine: send nothing more
                    raise self._fatal
                try:
                    return self._completion(await create(**params), request.label_words, label_ids)
                except (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError) as exc:
                    self._fatal = FatalAPIError(
                        f"{self.config.base_url} refused the request ({exc.status_code}): {exc.message}. "
                        "Check the model name and "
                        + (
                            f"the key in ${self.config.api_key_env}."
                            if self.config.api_key_env
                            else "whether the endpoint needs a key (set api_key_env to the variable holding it)."
                        )
                    )
                    raise self._fatal from None
                except openai.BadRequestError as exc:
                    return error_completion(f"HTTP 400: {exc.message}")
                except (
                    openai.RateLimitError,
                    openai.InternalServerError,
                    openai.APIStatusError,
                    openai.APITimeoutError,
                    openai.APIConnectionError,
                    openai.APIResponseValidationError,
                    ValueError,
                ) as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                    wait = _retry_after(exc)
            if attempt == self.config.max_retries:
                break
            ceiling = min(self.config.backoff_max, self.config.backoff_base * 2**attempt)
            # A server's Retry-After is honoured up to our own bounds: a hostile or broken one (100000 s) must
            # not hold the run; every wait stays within backoff_max and the request timeout.
            wait = random.uniform(0, ceiling) if wait is None else wait
            await asyncio.sleep(min(wait, self.config.backoff_max, self.config.timeout))
        return error_completion(f"gave up after {self.config.max_retries + 1} attempts: {last_error}")

    async def _tokenize_labels(self, words: tuple[str, ...]) -> dict[str, list[int]] | None:
        """Each word's first-token ids from a vLLM server's /tokenize; None where the server has none."""
        import httpx

        root = self.config.base_url.rstrip("/").removesuffix("/v1")  # type: ignore[union-attr]
        ids: dict[str, list[int]] = {}
        try:
            async with httpx.AsyncClient(
                timeout=self.config.timeout, headers={"Authorization": f"Bearer {self._key}"}
            ) as http:
                for word in words:
                    firsts = set()
                    for variant in word_variants(word):
                        reply = await http.post(
                            f"{root}/tokenize",
                            json={"model": self.config.model, "prompt": variant, "add_special_tokens": False},
                        )
                        reply.raise_for_status()
                        firsts.add(int(reply.json()["tokens"][0]))
                    ids[word] = sorted(firsts)
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return None
        return ids

    def _completion(
        self, reply: Any, label_words: tuple[str, ...] | None, label_ids: dict[str, list[int]] | None = None
    ) -> Completion:
        if not getattr(reply, "choices", None):
            raise ValueError("reply without choices")
        choice = reply.choices[0]
        usage = reply.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        chat = hasattr(choice, "message")
        tokens = _token_logprobs(choice.logprobs, chat)
        return Completion(
            text=(choice.message.content if chat else choice.text) or "",
            finish_reason=choice.finish_reason,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            cached_tokens=(getattr(details, "cached_tokens", None) or 0) if details else 0,
            logprobs=[lp for lp, _ in tokens] or None,
            label_logprobs=_label_logprobs(tokens[0][1], label_words, label_ids) if label_words and tokens else None,
        )

    def close(self) -> None:
        """Close the HTTP client and stop its event loop."""
        if self._loop is not None:
            self._loop.run(self._client.close()).result()
            self._loop.stop()
            self._loop = None


class _Loop:
    """An asyncio loop on a daemon thread: the engine's one HTTP client (and its connection pool) lives here
    across streams and calls, while the caller's thread submits and polls synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="diagsafe-openai", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class OpenAIStream:
    """A stream over the API engine: every submitted request is on its way at once (the engine's semaphore
    keeps `concurrency` of them on the wire); a poll returns those that finished. Finished requests queue
    themselves (a done-callback), so a poll costs what finished, not what is in flight: waiting on every pending
    future at each poll made a stream of n requests cost n² waiter installs. An endpoint that refuses every
    request (bad key, unknown model) cancels the rest and raises."""

    def __init__(self, engine: OpenAIEngine) -> None:
        self.engine = engine
        self._futures: dict[concurrent.futures.Future[Completion], Hashable] = {}
        self._done: queue.SimpleQueue[concurrent.futures.Future[Completion]] = queue.SimpleQueue()

    def submit(self, key: Hashable, request: GenerationRequest) -> None:
        future = self.engine.submit(request)
        self._futures[future] = key
        future.add_done_callback(self._done.put)

    def poll(self) -> list[tuple[Any, Completion]]:
        if not self._futures:
            return []
        try:
            done = [self._done.get(timeout=POLL_WAIT)]
        except queue.Empty:
            return []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                break
        finished = []
        for future in done:
            key = self._futures.pop(future, None)
            if key is None:  # cancelled by close()
                continue
            try:
                finished.append((key, future.result()))
            except BaseException:
                self.close()
                raise
        return finished

    @property
    def pending(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        """Cancel whatever is still in flight."""
        futures, self._futures = self._futures, {}
        for future in futures:
            future.cancel()
