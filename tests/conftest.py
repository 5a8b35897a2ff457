"""Shared fixtures: anyio pinned to asyncio, and the upstream Talos samples read from ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shared_dir() -> Path | None:
    """``../shared`` beside the checkout (CI lays a copy there); ICHORD_SHARED overrides."""
    env = os.environ.get("ICHORD_SHARED")
    path = Path(env) if env else REPO.parent / "shared"
    return path if path.is_dir() else None


@pytest.fixture
def talos_samples() -> Path:
    """Upstream Talos sample files (data for tests, never copied into the repo)."""
    base = shared_dir()
    if base is None or not (base / "reference" / "talos").is_dir():
        pytest.skip("../shared/reference/talos is absent: the upstream Talos samples are read from there")
    return base / "reference" / "talos"
