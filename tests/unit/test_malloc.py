"""ichord.malloc: the mmap threshold is fixed on glibc, and an operator's MALLOC_MMAP_THRESHOLD_ is left alone."""

from __future__ import annotations

import ctypes

import pytest

from ichord import malloc


def _glibc() -> bool:
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="mallopt's M_MMAP_THRESHOLD is glibc's")
def test_set_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert malloc.fix_mmap_threshold() is True


def test_the_operators_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert malloc.fix_mmap_threshold() is False


def test_idle_trim_at_most_once_per_interval() -> None:
    now = [100.0]
    calls: list[int] = []
    trim = malloc.IdleTrim(interval=30.0, clock=lambda: now[0], trim=calls.append)
    assert trim.maybe_trim() is True and calls == [0]
    now[0] += 29.0
    assert trim.maybe_trim() is False  # too soon: a burst of idle moments trims once
    now[0] += 1.0
    assert trim.maybe_trim() is True and trim.trims == 2


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_the_process_trim_runs_on_glibc() -> None:
    assert malloc.IdleTrim(interval=0.0).maybe_trim() is True
