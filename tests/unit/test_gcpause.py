"""The master's long-lived state and the cyclic garbage collector (master/runtime/gcpause.py)."""

from __future__ import annotations

import gc
import logging

import pytest

from mgpu.master.runtime import gcpause


def test_a_big_submit_freezes_what_exists_and_a_small_one_does_not() -> None:
    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # tracked objects that live on
    gcpause.after_bulk(gcpause.BULK - 1)
    assert gc.get_freeze_count() == before
    try:
        gcpause.after_bulk(gcpause.BULK)
        assert gc.get_freeze_count() >= before + len(kept)
    finally:
        gc.unfreeze()


def test_a_slow_collection_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gcpause, "SLOW", 0.0)
    gcpause.watch()
    gcpause.watch()  # once per process, however often asked
    try:
        assert gc.callbacks.count(gcpause._timer) == 1
        with caplog.at_level(logging.WARNING, logger="mgpu.master"):
            gc.collect(2)
        assert any("garbage collection of generation 2 took" in r.message for r in caplog.records)
        assert gcpause.slowest > 0
    finally:
        gc.callbacks.remove(gcpause._timer)


def test_collection_pauses_nest_and_resume_after_the_last() -> None:
    assert gc.isenabled()
    first = gcpause.paused()
    second = gcpause.paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)  # the other big submit is still building its tasks
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gcpause.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_tune_makes_young_collections_rarer_and_keeps_the_older_thresholds() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 9, 11)
        gcpause.tune()
        assert gc.get_threshold() == (gcpause.YOUNG, 9, 11)
        assert gcpause.YOUNG > 700
    finally:
        gc.set_threshold(*saved)
