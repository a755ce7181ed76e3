"""memtree.spare_core: the side work runs on a helper thread when one is idle, on the
caller's thread otherwise, and neither outlives the call."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from memtree.spare_core import Overlap


def test_the_side_work_runs_on_a_helper_thread_beside_the_main_work() -> None:
    overlap = Overlap(1)
    caller = threading.get_ident()
    main_running = threading.Event()

    def side() -> int:
        assert main_running.wait(30)  # main is still running: the two overlap
        return threading.get_ident()

    def main() -> str:
        main_running.set()
        return "main"

    first, side_thread = overlap.run(main, side)
    assert first == "main"
    assert side_thread != caller


def test_without_helpers_the_caller_does_both() -> None:
    caller = threading.get_ident()
    order: list[str] = []
    result = Overlap(0).run(lambda: order.append("main") or 1, lambda: order.append("side") or threading.get_ident())
    assert result == (1, caller)
    assert order == ["main", "side"]


def test_a_busy_helper_is_not_waited_for_the_caller_runs_the_side_work_itself() -> None:
    overlap = Overlap(1)
    side_started, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def occupy() -> None:
        def blocking_side() -> str:
            side_started.set()
            assert release.wait(30)
            return "first side"

        outcome["first"] = overlap.run(lambda: "first main", blocking_side)

    holder = threading.Thread(target=occupy)
    holder.start()
    try:
        assert side_started.wait(30)
        caller = threading.get_ident()
        assert overlap.run(lambda: "second main", threading.get_ident) == ("second main", caller)
    finally:
        release.set()
        holder.join()
    assert outcome["first"] == ("first main", "first side")
    assert overlap.run(lambda: 0, threading.get_ident)[1] != threading.get_ident()  # the helper is free again


def test_an_error_in_main_is_raised_after_the_side_work_has_finished() -> None:
    overlap = Overlap(1)
    go = threading.Event()
    finished: list[bool] = []

    def side() -> None:
        assert go.wait(30)
        finished.append(True)

    def main() -> None:
        go.set()
        raise RuntimeError("main failed")

    with pytest.raises(RuntimeError, match="main failed"):
        overlap.run(main, side)
    assert finished == [True]


def test_an_error_in_the_side_work_is_raised_to_the_caller() -> None:
    def side() -> None:
        raise KeyError("side failed")

    for workers in (0, 1):
        with pytest.raises(KeyError, match="side failed"):
            Overlap(workers).run(lambda: None, side)


def _use_after_fork(overlap: Overlap, results: multiprocessing.Queue[tuple[int, bool]]) -> None:
    caller = threading.get_ident()
    value, side_thread = overlap.run(lambda: 7, threading.get_ident)
    results.put((value, side_thread != caller))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork()")
def test_a_forked_child_starts_its_own_helper_instead_of_waiting_for_the_parents() -> None:
    overlap = Overlap(1)
    overlap.run(lambda: None, lambda: None)  # the parent's helper thread exists now
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue[tuple[int, bool]] = context.Queue()
    child = context.Process(target=_use_after_fork, args=(overlap, results))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked child hung waiting for a helper thread it does not have")
    assert child.exitcode == 0
    assert results.get(timeout=10) == (7, True)
