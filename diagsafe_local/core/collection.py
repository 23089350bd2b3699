"""The cyclic garbage collector's pace while a run is read.

Reading a run keeps what it verifies (a manifest of 1,000 items is ~5,000 objects, the tallies, a comparison's
columns) while short-lived records stream past, freed by their reference counts. At the default pace (a young
collection every 700 objects kept, an older one every ten of those) the kept objects are scanned again and
again as they age: a series report of 100 runs spent ~0.27 CPU s in ~1,200 collections, 4 % of the command, to
free almost nothing. `fewer_collections` raises the young threshold for a scope and gives the caller's back on
the way out, even on an exception. The collector is never disabled: a cycle made while reading is still
collected, at most `YOUNG` objects later, so memory stays bounded however many records a run has.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Objects allocated (net of those freed) between two young collections in the scope: the default is 700. At
# 10,000 a series report spent ~0.04 s collecting instead of ~0.27 s; garbage in cycles waits at most this many
# objects (a few MB) before it is freed.
YOUNG = 10_000


@contextmanager
def fewer_collections(young: int = YOUNG) -> Iterator[None]:
    """Young collections at most every `young` objects for the scope (a caller's threshold that is higher already,
    or 0, automatic collection off, is kept); the caller's thresholds are restored on the way out. A scope that
    raised nothing restores nothing: scopes in two threads that end in either order leave the thresholds as the
    first found them (the one that raised them gives them back)."""
    before = gc.get_threshold()
    if not 0 < before[0] < young:
        yield
        return
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
