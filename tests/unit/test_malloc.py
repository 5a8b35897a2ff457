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
