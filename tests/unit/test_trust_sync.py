"""The trust sync's pure parts: which events request a pass, one pass at a time, rotation.yaml's certificate."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from ichord.api.views import OperationView
from ichord.settings import Timing
from ichord.trust.pool import TrustPool
from ichord.trust.sync import (
    PassResult,
    TrustSync,
    rotation_under_way,
)
from ichord.watchers.informer import WatchEvent

pytestmark = pytest.mark.anyio


def op(stage: str | None = None, phase: str | None = None, kind: str = "ca-rotation") -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"namespace": "default", "name": "r"},
                           "spec": {"kind": kind, "clusterRef": {"name": "c1"}}}
    if stage is not None or phase is not None:
        obj["status"] = {"caRotation": {"stage": stage} if stage else {}, **({"phase": phase} if phase else {})}
    return obj


class Recorder(TrustSync):
    """Counts passes and how many ran at once; a pass takes ``hold`` seconds."""

    def __init__(self, tick: float = 60.0, hold: float = 0.0) -> None:
        super().__init__(None, TrustPool(), trust_file=None,  # type: ignore[arg-type]
                         timing=dataclasses.replace(Timing(), trust_sync_tick=tick))
        self.hold = hold
        self.running = 0
        self.most = 0

    async def pass_once(self) -> PassResult:
        self.passes += 1
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await anyio.sleep(self.hold)
        finally:
            self.running -= 1
        return PassResult()


def ca_rotation_underway(o: dict[str, Any]) -> bool:
    return rotation_under_way(OperationView.of(o))


def test_under_way_means_a_stage_set_and_not_completed() -> None:
    assert not ca_rotation_underway(op())  # created, no status yet
    assert not ca_rotation_underway(op(phase="Pending"))  # planned only
    assert ca_rotation_underway(op("Accepting", "InProgress"))
    assert ca_rotation_underway(op("Issuing", "Paused"))
    assert ca_rotation_underway(op("Dropping", "Failed"))  # failed mid-way: its CA may be serving
    assert not ca_rotation_underway(op("Done", "InProgress"))
    assert not ca_rotation_underway(op("Finalizing", "Completed"))
    assert not ca_rotation_underway(op("Accepting", "InProgress", kind="config-rollout"))


def test_handler_requests_on_rotations_under_way_and_on_completion_only() -> None:
    sync = Recorder()
    sync.on_operation(WatchEvent("ADDED", op()))  # the creation event: no status
    sync.on_operation(WatchEvent("MODIFIED", op(phase="Pending"), op()))
    sync.on_operation(WatchEvent("MODIFIED", op("Accepting", kind="config-rollout")))
    sync.on_operation(WatchEvent("DELETED", op("Accepting", "InProgress")))
    assert sync._requested is False
    sync.on_operation(WatchEvent("MODIFIED", op("Accepting", "InProgress"), op()))
    assert sync._requested is True
    sync._requested = False
    done = op("Done", "Completed")
    sync.on_operation(WatchEvent("MODIFIED", done, op("Finalizing", "InProgress")))
    assert sync._requested is True  # the completion tries the clear at once
    sync._requested = False
    sync.on_operation(WatchEvent("MODIFIED", done, done))  # completed long ago: a relabel, say
    assert sync._requested is False


async def test_one_pass_at_a_time_and_a_burst_costs_one_more_pass() -> None:
    sync = Recorder(hold=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        sync.request()
        while sync.running == 0:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        for _ in range(100):  # a burst while the first pass runs: folded into one slot
            sync.request()
        with anyio.fail_after(5):
            while sync.passes < 2 or sync.running:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    assert sync.most == 1
    assert sync.passes == 2


async def test_a_request_before_the_loop_starts_is_not_lost_and_the_tick_runs_passes() -> None:
    sync = Recorder(tick=0.02)
    sync.request()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sync.run)
        with anyio.fail_after(5):
            while sync.passes < 4:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    assert sync.most == 1
