"""Continuous generation: each (item, sample) is a stream of turns fed to the engine's request stream; a
conversation's next turn is submitted the moment its previous answer is final, so conversations of 1 and 4
turns never wait for each other and no turn is a barrier.

Pre-filled turns are recorded without an engine call. A stream whose answer failed stops there (its later
turns are reported as errors by the judge step; a rerun retries the failed turn). Every answer is appended
(and fsynced) as soon as the engine step that finished it returns, so a killed run resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diagsafe_local.core.hashing import content_key
from diagsafe_local.core.jsonl import JsonlStore
from diagsafe_local.core.messages import Message
from diagsafe_local.engines.base import Engine, GenerationRequest
from diagsafe_local.engines.identity import EngineIdentity
from diagsafe_local.engines.streams import open_stream
from diagsafe_local.evaluation.config import TargetConfig
from diagsafe_local.evaluation.context import RunContext
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
        record = store.get((target, item.id, sample, turn))
        if record is not None:
            out[turn] = record
    return out


def turn_key(identity: EngineIdentity, conversation: Sequence[Message], sample: int, recorded: str | None) -> str:
    """What a stored answer must have been made from to be reused: the model (by content), the exact
    conversation sent (earlier answers included), the sample index, and a replayed answer's text."""
    return content_key(identity.key(), list(conversation), sample, recorded)


@dataclass(frozen=True)
class Answer:
    """An answer as generation made it: its record and the conversation it answers (what the judge is shown)."""

    record: GenerationRecord
    conversation: tuple[Message, ...]


def plan_stream(
    ctx: RunContext, target: TargetConfig, item: Item, sample: int
) -> tuple[list[Answer], tuple[int, str, GenerationRequest] | None]:
    """One stream's next work: the replayed answers to record, and the (turn, key, request) to generate next
    (None when the stream is done, or stopped by a failed turn). A stored answer is reused only if its key
    matches: changed prompts, earlier answers or models are redone."""
    label, sampling = target.label, target.sampling
    identity = ctx.identities[label]
    done = stream_answers(ctx.directory.generations, label, item, sample)
    answers: dict[int, str] = {}
    prefilled: list[Answer] = []
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
        record = GenerationRecord(
            target=label,
            item_id=item.id,
            sample=sample,
            turn=turn,
            answer=recorded,
            finish_reason=None,
            prefilled=True,
            request_key=key,
        )
        prefilled.append(Answer(record, conversation))
        answers[turn] = recorded
    return prefilled, None


def generation_done(ctx: RunContext, target: TargetConfig) -> bool:
    """Whether every turn of every stream has a current, successful answer."""
    return all(
        plan_stream(ctx, target, item, sample) == ([], None)
        for item in ctx.items
        for sample in range(target.sampling.n)
    )


# Streams on their way at once: more than any engine runs side by side (vLLM's max_num_seqs, an endpoint's
# concurrency), so none waits for work, and few enough that what is in flight is all a run holds in memory.
STREAMS_IN_FLIGHT = 4096


def _to_generate(item: Item, turn: int) -> int:
    """The turns of an item from `turn` on that a target answers (not those the item itself prefills)."""
    return sum(item.prefilled(k) is None for k in range(turn, item.n_turns + 1))


def generate_streams(
    engine: Engine,
    ctx: RunContext,
    target: TargetConfig,
    on_progress: Callable[[int, int], None] | None = None,
    on_answers: Callable[[list[Answer]], None] | None = None,
    on_poll: Callable[[], object] | None = None,
    max_batch: int = 256,
) -> tuple[int, int]:
    """Generate every missing or stale answer of `target` through one request stream: a conversation's next
    turn is submitted the moment its previous answer is in, and every answer is appended to the generations
    store as soon as it is final (a killed run loses only what was in flight). `on_answers` sees every appended
    batch with the conversations answered (the pipeline hands them to a colocated judge from there) and
    `on_poll` runs after every engine step (the colocated judge steps there). Returns (generated, replayed)."""
    stream = open_stream(engine, max_batch)
    store = ctx.directory.generations
    sent: dict[tuple[str, int, int, str], tuple[Message, ...]] = {}
    generated = replayed = 0
    streams = ((item, sample) for item in ctx.items for sample in range(target.sampling.n))
    # every turn to generate, less what each stream will not generate, as it is taken up
    total = target.sampling.n * sum(_to_generate(item, 1) for item in ctx.items)

    def advance(item: Item, sample: int, first: bool = False) -> None:
        nonlocal replayed, total
        prefilled, work = plan_stream(ctx, target, item, sample)
        if prefilled:
            store.append(a.record for a in prefilled)
            replayed += len(prefilled)
            if on_answers:
                on_answers(prefilled)
        if first:  # what a resumed or stopped stream will not generate comes off the total
            total -= _to_generate(item, 1) - (0 if work is None else _to_generate(item, work[0]))
        if work is None:
            return
        turn, key, request = work
        sent[(item.id, sample, turn, key)] = request.messages
        stream.submit((item.id, sample, turn, key), request)

    def take_up() -> None:
        """Start streams until `STREAMS_IN_FLIGHT` are on their way (or none is left to start)."""
        while stream.pending < STREAMS_IN_FLIGHT:
            started = next(streams, None)
            if started is None:
                return
            advance(*started, first=True)

    try:
        take_up()
        if on_progress:
            on_progress(0, total)
        while stream.pending:
            finished = stream.poll()
            if on_poll:
                on_poll()
            if not finished:
                continue
            answers = [
                Answer(
                    GenerationRecord(
                        target=target.label,
                        item_id=item_id,
                        sample=sample,
                        turn=turn,
                        # a failed turn is no answer, whatever text the engine had when it failed: what
                        # verify takes an engine error to be (`rederive.failed`), and no later turn reads it
                        answer="" if c.error else c.text,
                        finish_reason="error" if c.error else c.finish_reason,
                        error=c.error,
                        request_key=key,
                        usage=Usage.of(c),
                    ),
                    sent.pop((item_id, sample, turn, key)),
                )
                for (item_id, sample, turn, key), c in finished
            ]
            store.append(a.record for a in answers)
            generated += len(answers)
            if on_answers:
                on_answers(answers)
            for answer in answers:
                if answer.record.error is None:  # a failed turn stops its stream: its later turns are errors
                    advance(ctx.items_by_id[answer.record.item_id], answer.record.sample)
            take_up()
            if on_progress:
                on_progress(generated, max(total, generated))
    finally:
        stream.close()
    return generated, replayed
