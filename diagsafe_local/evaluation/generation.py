"""Turn-by-turn batched generation: at turn k, every conversation that has a k-th user turn goes into one
engine call; answers are appended; conversations of different lengths finish independently.

Each (item, sample) is a stream. Pre-filled turns are recorded without an engine call. A stream whose
answer failed stops there (its later turns are reported as errors by the judge step). Every turn's
answers are saved before the next turn starts, so a killed run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from diagsafe_local.core.hashing import content_key, request_seed
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine, GenerationRequest
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.items import Item
from diagsafe_local.evaluation.records import GenerationRecord, Usage


def conversation_until(
    item: Item, turn: int, answers: dict[int, str], system_prompt: str | None = None
) -> tuple[Message, ...]:
    """Messages up to and including user turn `turn`; earlier turns carry their (generated or recorded) answers."""
    messages: list[Message] = []
    if system_prompt and item.messages[0].role != "system":
        messages.append(Message(role="system", content=system_prompt))
    if item.messages[0].role == "system":
        messages.append(item.messages[0])
    for k, pos in enumerate(item.user_positions, start=1):
        messages.append(item.messages[pos])
        if k == turn:
            break
        messages.append(Message(role="assistant", content=answers[k]))
    return tuple(messages)


def stream_answers(store: JsonlStore, target: str, item: Item, sample: int) -> dict[int, GenerationRecord]:
    """The stored answers of one stream, by turn."""
    out = {}
    for turn in range(1, item.n_turns + 1):
        record = store.records.get((target, item.id, sample, turn))
        if record is not None:
            out[turn] = record
    return out


def turn_key(identity: dict[str, Any], conversation: Sequence[Message], sample: int, recorded: str | None) -> str:
    """What a stored answer must have been made from to be reused: the model (by content), the exact
    conversation sent (earlier answers included), the sample index, and a replayed answer's text."""
    return content_key(identity, list(conversation), sample, recorded)


def plan_turn(
    target: TargetConfig,
    identity: dict[str, Any],
    items: Sequence[Item],
    store: JsonlStore,
    turn: int,
) -> tuple[list[GenerationRecord], list[tuple[Item, int, str, GenerationRequest]]]:
    """Turn `turn`'s work: replayed answers to record, and requests to generate (with their keys). A stored
    answer is reused only if its key matches: changed prompts, earlier answers or models are redone."""
    label, sampling = target.label, target.sampling
    prefilled: list[GenerationRecord] = []
    pending: list[tuple[Item, int, str, GenerationRequest]] = []
    for item in items:
        if item.n_turns < turn:
            continue
        for sample in range(sampling.n):
            done = stream_answers(store, label, item, sample)
            if any(k not in done or done[k].error for k in range(1, turn)):
                continue  # an earlier turn failed or is missing: the stream stops there
            answers = {k: done[k].answer for k in range(1, turn)}
            conversation = conversation_until(item, turn, answers, target.system_prompt)
            recorded = item.prefilled(turn)
            key = turn_key(identity, conversation, sample, recorded)
            stored = done.get(turn)
            if stored is not None and stored.error is None and stored.request_key == key:
                continue
            if recorded is not None:
                prefilled.append(
                    GenerationRecord(
                        target=label,
                        item_id=item.id,
                        sample=sample,
                        turn=turn,
                        answer=recorded,
                        finish_reason=None,
                        prefilled=True,
                        request_key=key,
                    )
                )
                continue
            pending.append(
                (
                    item,
                    sample,
                    key,
                    GenerationRequest(
                        messages=conversation,
                        max_tokens=sampling.max_tokens,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        seed=request_seed(sampling.seed, label, item.id, sample, turn),
                    ),
                )
            )
    return prefilled, pending


def generation_done(target: TargetConfig, identity: dict[str, Any], items: Sequence[Item], store: JsonlStore) -> bool:
    """Whether every turn of every stream has a current, successful answer."""
    turns = range(1, max((item.n_turns for item in items), default=0) + 1)
    return all(plan_turn(target, identity, items, store, turn) == ([], []) for turn in turns)


def generate_turns(
    engine: Engine,
    target: TargetConfig,
    identity: dict[str, Any],
    items: Sequence[Item],
    store: JsonlStore,
    on_turn: Callable[[int, int], None] | None = None,
) -> tuple[int, int]:
    """Generate every missing or stale answer of `target`, one engine call per turn; returns (answers generated,
    replayed answers recorded)."""
    generated = replayed = 0
    turns = max((item.n_turns for item in items), default=0)
    if on_turn:
        on_turn(0, turns)
    for turn in range(1, turns + 1):
        prefilled, pending = plan_turn(target, identity, items, store, turn)
        store.append(prefilled)
        replayed += len(prefilled)
        if not pending:
            continue
        completions = engine.generate([request for *_, request in pending])
        store.append(
            GenerationRecord(
                target=target.label,
                item_id=item.id,
                sample=sample,
                turn=turn,
                answer=c.text,
                finish_reason=c.finish_reason,
                error=c.error,
                request_key=key,
                usage=Usage(
                    prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, cached_tokens=c.cached_tokens
                ),
            )
            for (item, sample, key, _), c in zip(pending, completions)
        )
        generated += len(pending)
        if on_turn:
            on_turn(turn, turns)
    return generated, replayed
