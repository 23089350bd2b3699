"""Run the CLI and SIGKILL its whole process group once a named JSONL file holds N lines.

A node failure at a chosen point: tests that kill a run mid-way used to poll the file from outside and kill
when they saw it grow, which lost the race on a loaded machine (the run finished first). Here the kill comes
right after the append that reaches N lines, from inside, so the run is always cut where the test says.

    python tests/node_failure.py FILE_NAME N diagsafe-local-arguments...

Start it with `start_new_session=True`: the process group it kills must be its own (front end and engine
cores), never the test runner's.
"""

import os
import signal
import sys
from collections.abc import Iterable


def main() -> None:
    from diagsafe_local import cli
    from diagsafe_local.core.jsonl import JsonlStore

    name, count, *arguments = sys.argv[1:]
    if os.getpgrp() != os.getpid():
        sys.exit("node_failure.py must lead its own process group (start_new_session=True)")
    append = JsonlStore.append

    def append_then_fail(self: JsonlStore, records: Iterable) -> None:  # type: ignore[type-arg]
        append(self, records)
        if self.path.name == name and self.path.read_text().count("\n") >= int(count):
            os.killpg(os.getpgrp(), signal.SIGKILL)

    JsonlStore.append = append_then_fail  # type: ignore[method-assign]
    sys.argv = ["diagsafe-local", *arguments]
    cli.main()


if __name__ == "__main__":  # vLLM's engine processes re-import the main module
    main()
