"""The cluster lock on the Kubernetes API simulator over HTTPS."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ichord.api.names import LockRefusal
from ichord.api.operation_kinds import CA_ROTATION, KindDescription
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.leases import LeaseRecord, create_lease, get_lease
from ichord.operations.lock import Exclusion, LockMemo, acquire_disruptive_lock, lock_holder, release_lock
from ichord.sim.kube import KubeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "ichord-system"


@pytest.fixture
async def sim() -> AsyncIterator[KubeSimulator]:
    async with KubeSimulator() as server:
        yield server


@pytest.fixture
async def kube(sim: KubeSimulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"))
    await client.raw("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}})
    yield client
    await client.close()


class Clock:
    def __init__(self) -> None:
        self.t = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.t


async def test_lock_lifecycle(kube: KubeClient) -> None:
    clock = Clock()

    async def take(uid: str, cps: int = 3):  # type: ignore[no-untyped-def]
        return await acquire_disruptive_lock(kube, NS, "demo", uid, approved_control_planes=cps,
                                             excluding=None, duration=300, now=clock)

    assert (await take("op-a")).acquired
    assert await lock_holder(kube, NS, "demo", now=clock) == "op-a"
    refused = await take("op-b")
    assert not refused.acquired and refused.reason == LockRefusal.HELD and "op-a" in refused.message
    # renewing by the holder works; a stale lock of a dead operation is taken over
    clock.t += dt.timedelta(seconds=200)
    assert (await take("op-a")).acquired
    clock.t += dt.timedelta(seconds=299)
    assert not (await take("op-b")).acquired
    clock.t += dt.timedelta(seconds=2)
    assert (await take("op-b")).acquired
    assert await lock_holder(kube, NS, "demo", now=clock) == "op-b"
    # release only by the holder
    assert not await release_lock(kube, NS, "demo", "op-a")
    assert await release_lock(kube, NS, "demo", "op-b")
    assert await lock_holder(kube, NS, "demo", now=clock) is None
    assert (await take("op-c")).acquired


async def test_refusals_before_anything_is_written(kube: KubeClient) -> None:
    even = await acquire_disruptive_lock(kube, NS, "demo", "op-a", approved_control_planes=2,
                                         excluding=None, duration=300)
    assert not even.acquired and even.reason == LockRefusal.CLUSTER_TRANSITIONING
    rotation = Exclusion("op-rot", f"{NS}/rotate", CA_ROTATION)
    rotating = await acquire_disruptive_lock(kube, NS, "demo", "op-a", approved_control_planes=3,
                                             excluding=rotation, duration=300)
    assert not rotating.acquired and rotating.reason == LockRefusal.CLUSTER_CA_ROTATING
    assert rotating.message.startswith(f"a CA rotation (operation {NS}/rotate) is under way on cluster demo")
    assert await lock_holder(kube, NS, "demo") is None  # nothing was written
    own = await acquire_disruptive_lock(kube, NS, "demo", "op-rot", approved_control_planes=3,
                                        excluding=rotation, duration=300)
    assert own.acquired


async def test_another_excluding_kind_refuses_in_its_own_words(kube: KubeClient) -> None:
    """Issue 29: an excluding kind that rotates no CA is named by its title, with a reason that names no kind."""
    drill = KindDescription(name="drill", condition_type="Drilled", finalizer="example.test/drill", title="a drill",
                            section="drill", holds_machines=True, excludes_others=True)
    refused = await acquire_disruptive_lock(kube, NS, "demo", "op-a", approved_control_planes=3,
                                            excluding=Exclusion("op-drill", f"{NS}/bore", drill), duration=300)
    assert not refused.acquired and refused.reason == LockRefusal.CLUSTER_OPERATION_EXCLUSIVE
    assert refused.message == (f"a drill (operation {NS}/bore) is under way on cluster demo; this operation waits "
                               "until it completes")
    assert "rotation" not in refused.message
    assert await lock_holder(kube, NS, "demo") is None  # nothing was written


async def test_an_old_named_lock_still_fences_after_the_upgrade(kube: KubeClient) -> None:
    """An earlier version's ``ichor-lock-<cluster>`` held by a running operation refuses every other operation
    until it expires; the operation that holds it moves to ``ichord-lock-<cluster>`` and lets the old one go."""
    clock = Clock()
    t = clock()
    await create_lease(kube, NS, "ichor-lock-demo", LeaseRecord("op-old", 300, t, t))

    async def take(uid: str):  # type: ignore[no-untyped-def]
        return await acquire_disruptive_lock(kube, NS, "demo", uid, approved_control_planes=3,
                                             excluding=None, duration=300, now=clock,
                                             name_of=lambda u: {"op-old": "ns/rotate"}.get(u, u))

    refused = await take("op-new")
    assert not refused.acquired and refused.reason == LockRefusal.HELD
    assert "ns/rotate" in refused.message and "ichor-lock-demo" in refused.message  # named by namespace/name
    assert await get_lease(kube, NS, "ichord-lock-demo") is None  # nothing written on refusal
    # The old holder resumes under the new version: it takes the new Lease and releases the old one.
    assert (await take("op-old")).acquired
    assert await lock_holder(kube, NS, "demo", now=clock) == "op-old"
    old = await get_lease(kube, NS, "ichor-lock-demo")
    assert old is not None and old.holder is None
    assert not (await take("op-new")).acquired  # fenced by the new Lease now
    # An expired old lock fences nothing.
    await release_lock(kube, NS, "demo", "op-old")
    other = await get_lease(kube, NS, "ichord-lock-demo")
    assert other is not None
    await create_lease(kube, NS, "ichor-lock-other", LeaseRecord("op-gone", 300, t, t))
    clock.t += dt.timedelta(seconds=301)
    assert (await acquire_disruptive_lock(kube, NS, "other", "op-new", approved_control_planes=3,
                                          excluding=None, duration=300, now=clock)).acquired


async def test_the_holder_renews_with_one_put_and_a_lease_changed_since_is_read_and_decided_again(
        sim: KubeSimulator, kube: KubeClient) -> None:
    """operations/lock.py LockMemo: the lock as this process last wrote it is renewed with one PUT carrying that
    write's resourceVersion; a Lease another writer changed (409) or deleted (404) is read and decided as a first
    attempt is, so a memo never overwrites another holder."""
    clock = Clock()
    memo = LockMemo()

    async def take(uid: str, memo: LockMemo | None = memo):  # type: ignore[no-untyped-def]
        return await acquire_disruptive_lock(kube, NS, "demo", uid, approved_control_planes=3, excluding=None,
                                             duration=300, now=clock, memo=memo)

    assert (await take("op-a")).acquired
    for _ in range(3):
        clock.t += dt.timedelta(seconds=10)
        sim.requests.clear()
        assert (await take("op-a")).acquired
        assert [(e.verb, e.status) for e in sim.requests.entries] == [("update", 200)]
        record = await get_lease(kube, NS, "ichord-lock-demo")
        assert record is not None and record.holder == "op-a" and record.renew_time == clock.t
    # The lock lapses; another process (its own memo) takes it over: op-a's renewal as written meets a 409, reads
    # the Lease and is refused, and op-b's lock is left as op-b wrote it.
    clock.t += dt.timedelta(seconds=301)
    memo_b = LockMemo()
    assert (await take("op-b", memo_b)).acquired
    taken = await get_lease(kube, NS, "ichord-lock-demo")
    sim.requests.clear()
    refused = await take("op-a")
    assert not refused.acquired and refused.reason == LockRefusal.HELD and "op-b" in refused.message
    assert [(e.verb, e.status) for e in sim.requests.entries] == [("update", 409), ("get", 200)]
    assert await get_lease(kube, NS, "ichord-lock-demo") == taken
    # A memo of another operation's write is not used: the lock is read first.
    sim.requests.clear()
    assert not (await take("op-c", memo_b)).acquired
    assert [e.verb for e in sim.requests.entries] == ["get"]
    # The holder's own memo, with the Lease deleted under it: a 404, a read, and the Lease created again.
    await kube.raw("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/ichord-lock-demo")
    sim.requests.clear()
    assert (await take("op-b", memo_b)).acquired
    assert [(e.verb, e.status) for e in sim.requests.entries][:2] == [("update", 404), ("get", 404)]
    assert await lock_holder(kube, NS, "demo", now=clock) == "op-b"
