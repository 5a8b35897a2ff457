"""A config rollout's workers write their markers through one line (operations/config/workers.py StatusLine): what is
asked for while a write is in flight goes out together in the next one, each caller back only once the write that
carries its mutation is answered, and a failed write fails every caller it carried (on the simulator's API server)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ichord.kube.client import KubeClient
from ichord.kube.crds import CustomObjects, Kind
from ichord.kube.errors import KubeError
from ichord.operations.config import workers

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"
Obj = dict[str, Any]


class Counting(CustomObjects):
    """The operation's objects, counting status writes; ``fail_next`` makes the next one fail (as a refused write)."""

    def __init__(self, kube: KubeClient) -> None:
        super().__init__(kube, Kind.TALOS_OPERATION)
        self.writes: list[Obj] = []
        self.fail_next = False

    async def patch_status(self, namespace: str, name: str, patch: Any) -> Obj:
        self.writes.append(patch["status"])
        if self.fail_next:
            self.fail_next = False
            raise KubeError("refused (test)", status=500)
        return await super().patch_status(namespace, name, patch)


def _slot(machine: str, at: str) -> Any:
    def mutate(status: Obj, _obj: Obj) -> Obj | None:
        rolls = dict(status.get(workers.SLOTS) or {})
        rolls[machine] = {"done": [], "startedAt": at}
        status[workers.SLOTS] = rolls
        return status
    return mutate


async def _line(kube: KubeClient, name: str) -> tuple[Counting, workers.StatusLine]:
    """A new config operation ``name`` and a line on it that starts from the object as created."""
    ops = Counting(kube)
    created = await ops.create(NS, {"metadata": {"name": name}, "spec": {"clusterRef": {"name": "c1"},
                                                                        "kind": "config"}})
    return ops, workers.StatusLine(ops, NS, name, created)


async def test_twenty_workers_writing_at_once_go_in_two_writes_at_most_each_back_once_its_own_is_written(
        kube: KubeClient) -> None:
    ops, line = await _line(kube, "line")
    back: dict[str, Obj] = {}

    async def one(i: int) -> None:
        back[f"w{i}"] = await line.update(_slot(f"w{i}", f"t{i}"))

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
    # The first goes alone, or with those queued before it was sent; the rest, queued behind it, go together.
    assert 1 <= len(ops.writes) <= 2, [sorted(w.get(workers.SLOTS) or {}) for w in ops.writes]
    for machine, written in back.items():  # each caller's own mutation is in the object its write returned
        assert machine in written["status"][workers.SLOTS]
    stored = (await ops.get(NS, "line"))["status"][workers.SLOTS]
    assert sorted(stored) == sorted(f"w{i}" for i in range(20))
    assert line.obj is not None and line.obj["metadata"]["resourceVersion"] == \
        (await ops.get(NS, "line"))["metadata"]["resourceVersion"]


async def test_a_failed_write_fails_every_caller_it_carried_and_the_next_write_starts_from_a_fresh_read(
        kube: KubeClient) -> None:
    ops, line = await _line(kube, "line-fails")
    outcomes: dict[str, str] = {}
    first_sent = anyio.Event()

    async def first() -> None:
        # Holds the line while the others queue: its write is answered only after they have all asked.
        mutate = _slot("w0", "t0")

        def slow(status: Obj, obj: Obj) -> Obj | None:
            first_sent.set()
            return mutate(status, obj)
        await line.update(slow)
        outcomes["w0"] = "written"

    async def later(i: int) -> None:
        try:
            await line.update(_slot(f"w{i}", f"t{i}"))
            outcomes[f"w{i}"] = "written"
        except KubeError:
            outcomes[f"w{i}"] = "failed"

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await first_sent.wait()
        ops.fail_next = True  # the first write is already sent: the next one, carrying the other five, fails
        for i in range(1, 6):
            tg.start_soon(later, i)
    assert outcomes == {"w0": "written", **{f"w{i}": "failed" for i in range(1, 6)}}
    assert line.obj is None  # unknown after a failed write: read afresh before the next
    await line.update(_slot("w9", "t9"))
    stored = (await ops.get(NS, "line-fails"))["status"][workers.SLOTS]
    assert sorted(stored) == ["w0", "w9"]  # nothing the failed write carried was written


async def test_a_mutation_that_raises_fails_its_own_caller_and_the_others_it_rode_with_are_written(
        kube: KubeClient) -> None:
    ops, line = await _line(kube, "line-own-error")
    outcomes: dict[str, str] = {}

    def unreadable(_status: Obj, _obj: Obj) -> Obj | None:
        raise ValueError("its marker cannot be read (test)")

    async def one(machine: str, mutate: Any) -> None:
        try:
            await line.update(mutate)
            outcomes[machine] = "written"
        except ValueError:
            outcomes[machine] = "failed"

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(one, f"w{i}", unreadable if i == 2 else _slot(f"w{i}", f"t{i}"))
    assert outcomes == {"w0": "written", "w1": "written", "w2": "failed", "w3": "written", "w4": "written"}
    stored = (await ops.get(NS, "line-own-error"))["status"][workers.SLOTS]
    assert sorted(stored) == ["w0", "w1", "w3", "w4"]


async def test_the_sender_cancelled_mid_write_leaves_the_others_it_carried_to_the_next_sender(
        kube: KubeClient) -> None:
    ops, line = await _line(kube, "line-cancelled")
    held, release = anyio.Event(), anyio.Event()
    patch = ops.patch_status
    carried: list[str] = []

    async def stalled_once(namespace: str, name: str, body: Any) -> Obj:
        if not held.is_set():
            carried.extend(sorted(body["status"][workers.SLOTS]))
            held.set()
            await release.wait()  # never set: the sender is cancelled here, before its request is sent
        return await patch(namespace, name, body)

    ops.patch_status = stalled_once  # type: ignore[method-assign]
    outcomes: dict[str, str] = {}

    async def one(machine: str, scope: anyio.CancelScope | None = None) -> None:
        with scope or anyio.CancelScope():
            await line.update(_slot(machine, "t"))
            outcomes[machine] = "written"
            return
        outcomes[machine] = "cancelled"

    first = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "w0", first)
        for i in range(1, 4):
            tg.start_soon(one, f"w{i}")
        await held.wait()
        first.cancel()
    assert carried == ["w0", "w1", "w2", "w3"]  # the cancelled write carried all four
    assert outcomes == {"w0": "cancelled", "w1": "written", "w2": "written", "w3": "written"}
    stored = (await ops.get(NS, "line-cancelled"))["status"][workers.SLOTS]
    assert sorted(stored) == ["w1", "w2", "w3"]
