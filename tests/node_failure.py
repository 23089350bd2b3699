"""Run the CLI and signal it once a named JSONL file holds N lines: a failure at a chosen point.

Tests that stop a run mid-way used to poll the file from outside and signal when they saw it grow, which lost
the race on a loaded machine (the run went past the point, or finished, first). Here the signal comes from
inside, right after the append that reaches N lines, so the run is always cut where the test says.

    python tests/node_failure.py SIGKILL|SIGTERM FILE_NAME N diagsafe-local-arguments...

SIGKILL goes to the whole process group (front end and engine cores), like a node failure; SIGTERM to the
front end, like SLURM's time limit. Start it with `start_new_session=True`: the process group it kills must be
its own, never the test runner's.
"""

import os
import signal
import sys
from collections.abc import Iterable


def main() -> None:
    from diagsafe_local import cli
    from diagsafe_local.core.jsonl import JsonlStore

    how, name, count, *arguments = sys.argv[1:]
    if os.getpgrp() != os.getpid():
        sys.exit("node_failure.py must lead its own process group (start_new_session=True)")
    append = JsonlStore.append
    fired = False

    def append_then_fail(self: JsonlStore, records: Iterable) -> None:  # type: ignore[type-arg]
        nonlocal fired
        append(self, records)
        if not fired and self.path.name == name and self.path.read_text().count("\n") >= int(count):
            fired = True
            if how == "SIGKILL":
                os.killpg(os.getpgrp(), signal.SIGKILL)
            os.kill(os.getpid(), signal.Signals[how])

    JsonlStore.append = append_then_fail  # type: ignore[method-assign]
    sys.argv = ["diagsafe-local", *arguments]
    cli.main()


if __name__ == "__main__":  # vLLM's engine processes re-import the main module
    main()
