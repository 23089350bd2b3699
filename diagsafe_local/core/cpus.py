"""The CPUs this process may use: what a command sizes the processes it starts by."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the platform has one (a SLURM job's, `taskset`'s),
    else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
