"""The Event recorder against the simulator: dedup with count, aggregation, per-object rate limit,
scrubbing, and a failed post that is logged, never raised."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from ichord.kube.client import KubeClient
from ichord.kube.events import COMBINED_PREFIX, NORMAL, WARNING, EventRecorder, ObjectRef
from ichord.sim.kube import KubeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
OP = ObjectRef("TalosOperation", "default", "rot-1", "uid-1", "ichor.maesh.dev/v1alpha1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def events(sim: KubeSimulator) -> list[dict[str, Any]]:
    return sim.store.list(sim.store.resolve("", "v1", "events"), "default")[0]


async def test_identical_events_are_counted_not_repeated(sim: KubeSimulator, kube: KubeClient) -> None:
    rec = EventRecorder(kube)
    for _ in range(3):
        assert await rec.post(OP, NORMAL, "StageApplied", "Accepting applied to 3 machines")
    (ev,) = events(sim)
    assert ev["count"] == 3 and ev["reason"] == "StageApplied" and ev["type"] == NORMAL
    assert ev["involvedObject"] == {"kind": "TalosOperation", "namespace": "default", "name": "rot-1",
                                    "uid": "uid-1", "apiVersion": "ichor.maesh.dev/v1alpha1"}
    assert ev["source"]["component"] == "ichord" and ev["reportingComponent"] == "ichord"
    assert sim.requests.count("create", 201, "events") == 1 and sim.requests.count("patch", 200, "events") == 2


async def test_similar_events_are_aggregated(sim: KubeSimulator, kube: KubeClient) -> None:
    rec = EventRecorder(kube)
    for i in range(12):
        await rec.post(OP, WARNING, "OperationBlocked", f"machine m{i} unreachable")
    evs = events(sim)
    combined = [e for e in evs if e["message"].startswith(COMBINED_PREFIX)]
    assert len(evs) == 10 and len(combined) == 1
    assert combined[0]["count"] == 3  # the 10th, 11th and 12th distinct messages


async def test_rate_limit_per_object_with_refill(sim: KubeSimulator, kube: KubeClient) -> None:
    clock = FakeClock()
    rec = EventRecorder(kube, monotonic=clock, burst=5, refill_seconds=300, aggregate_max=1000)
    results = [await rec.post(OP, NORMAL, f"R{i}", "m") for i in range(7)]
    assert results == [True] * 5 + [False] * 2
    other = ObjectRef("TalosCluster", "default", "c1")
    assert await rec.post(other, NORMAL, "R", "m")  # another object has its own bucket
    clock.now += 300
    assert await rec.post(OP, NORMAL, "R8", "m")
    assert not await rec.post(OP, NORMAL, "R9", "m")
    assert len(events(sim)) == 7


async def test_scrub_and_failed_post_never_raises(sim: KubeSimulator, kube: KubeClient) -> None:
    rec = EventRecorder(kube, scrub=lambda s: s.replace("KEYDATA", "[redacted]"))
    assert await rec.post(OP, WARNING, "OperationBlocked", "bad key KEYDATA here")
    assert events(sim)[0]["message"] == "bad key [redacted] here"
    sim.faults.error_rate = {"create": 1.0}
    with capture_logs() as logs:
        assert not await rec.post(OP, WARNING, "Other", "refused")
    assert any(e["event"] == "event not posted" for e in logs)
    assert not await rec.post(ObjectRef("Event", "default", "x"), NORMAL, "R", "m")  # never about Events
    with pytest.raises(ValueError, match="Normal or Warning"):
        await rec.post(OP, "Error", "R", "m")


async def test_record_queues_without_blocking(sim: KubeSimulator, kube: KubeClient) -> None:
    rec = EventRecorder(kube, queue_size=2)
    for i in range(3):
        rec.record(OP, NORMAL, f"R{i}", "m")  # synchronous: returns at once
    assert rec.dropped == 1
    await rec.drain()
    assert sorted(e["reason"] for e in events(sim)) == ["R0", "R1"]
