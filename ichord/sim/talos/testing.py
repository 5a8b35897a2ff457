"""Helpers for tests and benchmarks that drive a simulated cluster (scaled-down timings)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ichord.sim.talos.node import Timings


def fast_timings(**overrides: float) -> Timings:
    """Milliseconds instead of seconds for every simulated delay."""
    values = {"reboot": 0.05, "kubelet_restart": 0.03, "apiserver_restart_delay": 0.08,
              "apiserver_ready_delay": 0.03, **overrides}
    return Timings(**values)


async def eventually(predicate: Callable[[], bool], within: float = 3.0, step: float = 0.005) -> None:
    """Wait until ``predicate()`` holds (sub-second polling), failing after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within} s")
        await asyncio.sleep(step)
