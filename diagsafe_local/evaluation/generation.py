"""Continuous generation: each (item, sample) is a stream of turns fed to the engine's request stream; a
conversation's next turn is submitted the moment its previous answer is final, so conversations of 1 and 4
turns never wait for each other and no turn is a barrier.

Pre-filled turns are recorded without an engine call. A stream whose answer failed stops there (its later
turns are reported as errors by the judge step; a rerun retries the failed turn). Every answer is appended
(and fsynced) as soon as the engine step that finished it returns, so a killed run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine, GenerationRequest
from diagsafe_local.engines.streams import open_stream
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.items import Item
from diagsafe_local.runs.records import GenerationRecord, Usage


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


def plan_stream(
    target: TargetConfig, identity: dict[str, Any], item: Item, sample: int, store: JsonlStore
) -> tuple[list[GenerationRecord], tuple[int, str, GenerationRequest] | None]:
    """One stream's next work: the replayed answers to record, and the (turn, key, request) to generate next
    (None when the stream is done, or stopped by a failed turn). A stored answer is reused only if its key
    matches: changed prompts, earlier answers or models are redone."""
    label, sampling = target.label, target.sampling
    done = stream_answers(store, label, item, sample)
    answers: dict[int, str] = {}
    prefilled: list[GenerationRecord] = []
    for turn in range(1, item.n_turns + 1):
        conversation = conversation_until(item, turn, answers, target.system_prompt)
        recorded = item.prefilled(turn)
        key = turn_key(identity, conversation, sample, recorded)
        stored = done.get(turn)
        if stored is not None and stored.error is None and stored.request_key == key:
            answers[turn] = stored.answer
            continue
        if recorded is None:
            return prefilled, (turn, key, sampling.request(conversation, label, item.id, sample, turn))
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
        answers[turn] = recorded
    return prefilled, None


def generation_done(target: TargetConfig, identity: dict[str, Any], items: Sequence[Item], store: JsonlStore) -> bool:
    """Whether every turn of every stream has a current, successful answer."""
    return all(
        plan_stream(target, identity, item, sample, store) == ([], None)
        for item in items
        for sample in range(target.sampling.n)
    )


def generate_streams(
    engine: Engine,
    target: TargetConfig,
    identity: dict[str, Any],
    items: Sequence[Item],
    store: JsonlStore,
    on_progress: Callable[[int, int], None] | None = None,
    on_records: Callable[[list[GenerationRecord]], None] | None = None,
    on_poll: Callable[[], object] | None = None,
    max_batch: int = 256,
) -> tuple[int, int]:
    """Generate every missing or stale answer of `target` through one request stream: a conversation's next
    turn is submitted the moment its previous answer is in, and every answer is appended to `store` as soon as
    it is final (a killed run loses only what was in flight). `on_records` sees every appended batch (the
    pipeline hands answers to a colocated judge from there) and `on_poll` runs after every engine step (the
    colocated judge steps there). Returns (answers generated, replayed)."""
    stream = open_stream(engine, max_batch)
    by_id = {item.id: item for item in items}
    generated = replayed = 0
    total = 0

    def advance(item: Item, sample: int) -> int:
        nonlocal replayed
        prefilled, work = plan_stream(target, identity, item, sample, store)
        if prefilled:
            store.append(prefilled)
            replayed += len(prefilled)
            if on_records:
                on_records(prefilled)
        if work is None:
            return 0
        turn, key, request = work
        stream.submit((item.id, sample, turn, key), request)
        return sum(item.prefilled(k) is None for k in range(turn, item.n_turns + 1))

    try:
        for item in items:
            for sample in range(target.sampling.n):
                total += advance(item, sample)
        if on_progress:
            on_progress(0, total)
        while stream.pending:
            finished = stream.poll()
            if on_poll:
                on_poll()
            if not finished:
                continue
            records = [
                GenerationRecord(
                    target=target.label,
                    item_id=item_id,
                    sample=sample,
                    turn=turn,
                    answer=c.text,
                    finish_reason=c.finish_reason,
                    error=c.error,
                    request_key=key,
                    usage=Usage.of(c),
                )
                for (item_id, sample, turn, key), c in finished
            ]
            store.append(records)
            generated += len(records)
            if on_records:
                on_records(records)
            for record in records:
                if record.error is None:  # a failed turn stops its stream: its later turns are reported as errors
                    advance(by_id[record.item_id], record.sample)
            if on_progress:
                on_progress(generated, max(total, generated))
    finally:
        stream.close()
    return generated, replayed
