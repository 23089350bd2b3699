"""The garbage collector's pace while a run is read (`core.collection`): raised for the scope, the caller's
thresholds given back whatever happens, and cycles still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagsafe_local.core.collection import YOUNG, fewer_collections
from diagsafe_local.core.errors import RunFailed
from diagsafe_local.runs.verify import verify_run


@pytest.fixture
def thresholds() -> Iterator[None]:
    """The test's own thresholds, and the session's back after it."""
    before = gc.get_threshold()
    gc.set_threshold(700, 9, 11)
    yield
    gc.set_threshold(*before)


def test_the_scope_raises_the_young_threshold_and_gives_the_callers_back(thresholds: None) -> None:
    with fewer_collections():
        assert gc.get_threshold() == (YOUNG, 9, 11)
        with fewer_collections(500):  # a scope inside one keeps the higher threshold
            assert gc.get_threshold() == (YOUNG, 9, 11)
        assert gc.get_threshold() == (YOUNG, 9, 11)
    assert gc.get_threshold() == (700, 9, 11)


def test_the_callers_thresholds_come_back_on_an_exception(thresholds: None) -> None:
    with pytest.raises(RuntimeError), fewer_collections():
        raise RuntimeError("a run that does not read")
    assert gc.get_threshold() == (700, 9, 11)


def test_a_higher_threshold_or_automatic_collection_off_is_kept(thresholds: None) -> None:
    for caller in ((50_000, 9, 11), (0, 9, 11)):
        gc.set_threshold(*caller)
        with fewer_collections():
            assert gc.get_threshold() == caller
        assert gc.get_threshold() == caller


def test_scopes_in_two_threads_that_end_in_either_order_give_the_first_callers_thresholds_back(
    thresholds: None,
) -> None:
    first, second = fewer_collections(), fewer_collections()
    first.__enter__()
    second.__enter__()  # another thread's scope, begun inside the first's
    first.__exit__(None, None, None)  # the first ends before it
    assert gc.get_threshold() == (700, 9, 11)
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (700, 9, 11)


def test_a_cycle_made_in_the_scope_is_collected_without_an_explicit_collection(thresholds: None) -> None:
    class Node:
        pass

    with fewer_collections():
        node = Node()
        node.self = node  # type: ignore[attr-defined]
        gone = weakref.ref(node)
        del node
        junk = [[] for _ in range(3 * YOUNG)]  # allocations enough for young collections at the raised threshold
        assert gone() is None
        del junk


def test_verify_run_gives_the_callers_thresholds_back_when_it_refuses(thresholds: None, tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunFailed, match="does not read"):
        verify_run(tmp_path)
    assert gc.get_threshold() == (700, 9, 11)
