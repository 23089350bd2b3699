"""Run the CLI and signal it from inside at a chosen point: a failure exactly where a test says.

Tests that stop a command mid-way used to poll a file from outside (or sleep) and signal when they saw it grow,
which lost the race on a loaded machine (the command went past the point, or finished, first). Here the signal
comes from inside, right after the event the test names:

    python tests/node_failure.py SIGKILL|SIGTERM FILE_NAME N diagsafe-local-arguments...

For a JSONL file, the append that brings FILE_NAME to N lines; for any other file, the N-th time the command
puts FILE_NAME in place (an atomic write: a manifest saved, a leaderboard written). SIGKILL goes to the whole
process group (front end and engine cores), like a node failure; SIGTERM to the front end, like SLURM's time
limit. Start it with `start_new_session=True`: the process group it kills must be its own, never the test
runner's.
"""

import os
import signal
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def main() -> None:
    from diagsafe_local import cli
    from diagsafe_local.core import atomic
    from diagsafe_local.core.jsonl import JsonlStore

    how, name, count, *arguments = sys.argv[1:]
    if os.getpgrp() != os.getpid():
        sys.exit("node_failure.py must lead its own process group (start_new_session=True)")
    fired = False
    seen = 0

    def fire() -> None:
        nonlocal fired
        fired = True
        if how == "SIGKILL":
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.Signals[how])

    append = JsonlStore.append

    def append_then_fail(self: JsonlStore, records: Iterable) -> None:  # type: ignore[type-arg]
        append(self, records)
        if not fired and self.path.name == name and self.path.read_text().count("\n") >= int(count):
            fire()

    put = atomic.atomic_path.__wrapped__  # the generator under the context manager

    @contextmanager
    def put_then_fail(path: str | Path) -> Iterator[Path]:
        nonlocal seen
        with contextmanager(put)(path) as tmp:
            yield tmp
        if Path(path).name == name and not fired:
            seen += 1
            if seen == int(count):
                fire()

    JsonlStore.append = append_then_fail  # type: ignore[method-assign]
    atomic.atomic_path = put_then_fail  # type: ignore[assignment]
    sys.argv = ["diagsafe-local", *arguments]
    cli.main()


if __name__ == "__main__":  # vLLM's engine processes re-import the main module
    main()
