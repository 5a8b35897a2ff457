"""Helpers shared by the tests that drive the Kubernetes API simulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from ichord.sim.kube import SimSettings, WatchSettings


def fast_bookmarks() -> SimSettings:
    """Simulator settings with a 50 ms watch bookmark interval (a fresh instance per test)."""
    return SimSettings(watch=WatchSettings(bookmark_interval=0.05))


async def eventually(pred: Callable[[], bool], within: float = 5.0, *, step: float = 0.01) -> None:
    """Wait until ``pred()`` holds, polling every ``step`` seconds; TimeoutError after ``within``."""
    with anyio.fail_after(within):
        while not pred():  # noqa: ASYNC110  (polling the API is the point)
            await anyio.sleep(step)


def machine(name: str, **spec: Any) -> dict[str, Any]:
    """A TalosMachine body for cluster ``c1`` with role worker; ``spec`` adds or overrides fields."""
    return {"metadata": {"name": name}, "spec": {"clusterRef": {"name": "c1"}, "role": "worker", **spec}}
