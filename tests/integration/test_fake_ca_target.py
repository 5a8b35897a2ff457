"""Issue 29, done when: a made-up CA-rotation target, from new files plus one registration line, is rotated through
the daemon's own machinery on the simulators: the cluster actor's step (ichord/actors, unchanged) over informers,
the registry, ca-rotation's plan, passes, custody and finalizing, the render of each stage and the node's CA view,
and delete: abandoned in an abandonable stage; then once more under the whole daemon in this process
(tests/integration/_daemon.py, shared with the census kind's test), nothing stepping it but the daemon.

The target is ``webhook`` (tests/integration/_fake_target.py): a CA only the control planes carry, kept in the
secrets bundle under ``certs.webhook``, placed in each control plane's configuration as a node annotation and read
back from the node's running configuration. The Kubernetes simulator enforces the CRDs' enums as the real API
server does, so the test serves the chart's TalosOperation and TalosCluster CRDs with ``webhook`` admitted (copies
built here from the CRDs as served; the chart's files are not edited). The printer columns are read by kubectl.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import anyio
import pytest

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.standalone import standalone_actor
from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import NotFound
from ichord.kube.leases import get_lease
from ichord.operations.lock import lock_name
from ichord.operations.outcome import Outcome, next_delay
from ichord.pki import targets as ca_targets
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.watchers.informer import Resource
from tests.integration import _fake_target as fake
from tests.integration._daemon import running_daemon, wait_until
from tests.integration._kubectl import KUBECTL, operation_columns

pytestmark = [pytest.mark.integration, pytest.mark.anyio,
              pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed and not built (scripts/tools.sh)")]

Obj = dict[str, Any]
SCALE = 0.01
#: The census test's scale; the ca-rotation bounds as the rotation tests keep them (_ca_rotation_driver.TIMING).
TIMING = replace(Timing().scaled(SCALE), ca_client_restart_timeout=30.0, ca_apiserver_unchanged=2.0,
                 ca_apiserver_ready_bound=30.0)


def _crd_path(kind: str) -> str:
    return f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{names.PLURALS[kind]}.{names.GROUP}"


@pytest.fixture
def registered() -> Iterator[None]:
    """The target registered while the test runs: the registry is process-wide, and the CRD-agreement tests expect
    ichord's own targets alone."""
    before = list(ca_targets.REGISTRY)
    ca_targets.register(fake.TARGET)  # the one registration line
    yield
    ca_targets.REGISTRY[:] = before


@pytest.fixture
async def env(registered: None) -> AsyncIterator[SimEnvironment]:
    # Made after the registration: the bundle has certs.webhook, and every control plane runs its manifest.
    async with SimEnvironment(bundle=generate_bundle(), time_scale=SCALE, control_planes=3, workers=1) as e:
        yield e


@dataclass
class Look:
    """What the test reads and creates, whoever runs the actor."""
    env: SimEnvironment
    kube: KubeClient

    async def op(self, name: str) -> Obj:
        return await crds.operations(self.kube).get(self.env.namespace, name)

    async def create(self, name: str) -> None:
        await crds.operations(self.kube).create(self.env.namespace, {"metadata": {"name": name}, "spec": {
            "clusterRef": {"name": self.env.cluster_name}, "kind": names.KIND_CA_ROTATION,
            "caRotation": {"targets": [fake.NAME]}}})

    async def published(self) -> dict[str, str]:
        """The cluster's status.certificates: name -> fingerprint."""
        cluster = await crds.clusters(self.kube).get(self.env.namespace, self.env.cluster_name)
        return {c["name"]: c["fingerprint"] for c in _status(cluster).get("certificates") or []}

    async def lease_holder(self) -> str | None:
        lease = await get_lease(self.kube, self.env.namespace, lock_name(self.env.cluster_name))
        return None if lease is None else lease.holder

    def secret(self) -> dict[str, bytes]:
        store = self.env.management.store
        obj = store.get(store.resolve("", "v1", "secrets"), self.env.namespace, self.env.secret_name)
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}

    def bundle(self) -> SecretsBundle:
        return SecretsBundle.from_yaml(self.secret()[names.SECRETS_KEY])

    async def events(self, kind: str) -> list[tuple[str, str, str]]:
        items = (await self.kube.raw("GET", f"/api/v1/namespaces/{self.env.namespace}/events"))["items"]
        return [(e["type"], e["reason"], e["message"]) for e in items if e["involvedObject"]["kind"] == kind]

    async def views(self) -> dict[str, Obj]:
        """Each machine's webhook CAs as its running configuration holds them (read over mutual TLS)."""
        out = {}
        async with TalosClient(DialBundle.from_bundle(self.bundle())) as talos:
            for m in self.env.machines:
                out[m.name] = fake.view_of(await talos.machine_config(m.address))
        return out


@dataclass
class World(Look):
    """The cluster's actor stepped by the test (ichord/actors/standalone.py)."""
    reconciler: ClusterReconciler

    async def run_until(self, name: str, done: Callable[[Obj | None], bool], *, steps: int = 600,
                        seen: Callable[[Obj | None], Awaitable[None]] | None = None) -> Obj | None:
        """Step the actor until ``done`` holds of operation ``name`` (None once it is gone)."""
        for _ in range(steps):
            outcome: Outcome = await self.reconciler.step({})
            try:
                op: Obj | None = await self.op(name)
            except NotFound:
                op = None
            if seen is not None:
                await seen(op)
            if done(op):
                return op
            await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))
        raise AssertionError(f"{name}: not there in {steps} steps")

    async def published_until(self, done: Callable[[dict[str, str]], bool], steps: int = 200) -> dict[str, str]:
        """Step the actor until the cluster's status.certificates (name -> fingerprint) satisfies ``done``."""
        for _ in range(steps):
            published = await self.published()
            if done(published):
                return published
            # What the daemon's router tells the actor when the bundle Secret changes (watchers/routing.py).
            await self.reconciler.step({("Secret", self.env.secret_name): "MODIFIED"})
            await anyio.sleep(0.02)
        raise AssertionError(f"status.certificates never showed it: {published}")

    async def columns(self, name: str) -> dict[str, str]:
        """``kubectl get talosoperations NAME``: header -> cell, as printed through the CRD's jsonPaths."""
        return await operation_columns(self.env.kubeconfig, self.env.namespace, name)


def _resource(kind: str) -> Resource:
    return Resource(names.GROUP, names.VERSION, names.PLURALS[kind])


async def _serve_fake_target_crds(kube: KubeClient) -> None:
    """The served CRDs with webhook admitted (the simulator, like kube-apiserver, refuses a value outside an enum)."""
    op_crd, cluster_crd = fake.fake_target_crds(await kube.raw("GET", _crd_path(names.TALOS_OPERATION)),
                                                await kube.raw("GET", _crd_path(names.TALOS_CLUSTER)))
    await kube.raw("PUT", _crd_path(names.TALOS_OPERATION), body=op_crd)
    await kube.raw("PUT", _crd_path(names.TALOS_CLUSTER), body=cluster_crd)


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await _serve_fake_target_crds(kube)
        async with standalone_actor(kube, env.namespace, env.cluster_name, TIMING, instance="test") as reconciler:
            yield World(env, kube, reconciler)


def _status(op: Obj | None) -> Obj:
    return dict((op or {}).get("status") or {})


def _ca(op: Obj | None) -> Obj:
    return dict(_status(op).get("caRotation") or {})


def _cps(env: SimEnvironment) -> list[str]:
    return [m.name for m in env.machines if m.role == "controlplane"]


async def test_a_fake_target_is_rotated_through_the_actor(world: World) -> None:
    env = world.env
    old = world.bundle().ca(fake.NAME)
    before = await world.views()
    for cp in _cps(env):  # the renderer placed the bundle's webhook CA on every control plane, none on the worker
        assert before[cp] == {"issuing": ca_fingerprint(old), "trusted": [ca_fingerprint(old)]}
    assert all(v["trusted"] == [] for m, v in before.items() if m not in _cps(env))

    await world.create("rotate")
    stages: list[str] = []
    columns: list[dict[str, str]] = []
    rotations: list[Rotation] = []

    async def seen(o: Obj | None) -> None:
        stage = str(_ca(o).get("stage") or "")
        if stage and (not stages or stages[-1] != stage):
            stages.append(stage)
            if stage == "Accepting":
                columns.append(await world.columns("rotate"))
        raw = world.secret().get(names.ROTATION_KEY)
        if raw is not None and not rotations:
            rotations.append(Rotation.from_yaml(raw))

    op = await world.run_until("rotate", lambda o: _status(o).get("phase") == names.Phase.COMPLETED
                               and not (o or {})["metadata"].get("finalizers"), seen=seen)
    status = _status(op)
    # Plan, stages and status as ca-rotation writes them for any target.
    assert status["plan"]["targets"] == [fake.NAME]
    assert stages[0] == "Accepting" and stages[-1] == "Done", stages
    assert "AwaitingCredentials" not in stages  # the target hands nothing off
    assert columns and (columns[0]["KIND"], columns[0]["STAGE"]) == (names.KIND_CA_ROTATION, "Accepting")
    condition = find(status["conditions"], names.CA_ROTATION) or {}
    assert condition.get("status") == "True"
    [rotation] = rotations
    new = rotation.new[next(iter(rotation.new))]
    [cert] = [c for c in _ca(op)["certificates"] if c["name"] == fake.NAME]
    assert (cert["previous"], cert["next"]) == (ca_fingerprint(old), ca_fingerprint(new))
    # The node view: control planes only, read with the target's own reader.
    for entry in status["machines"]:
        assert (fake.NAME in (entry.get("cas") or {})) == (entry["name"] in _cps(env)), entry

    # Done: the bundle holds the new CA (its key too), rotation.yaml is gone, each control plane signs and trusts the
    # new CA alone, the worker still carries nothing; the cluster publishes the new CA's expiry; the lock is free.
    assert names.ROTATION_KEY not in world.secret()
    assert world.bundle().ca(fake.NAME) == new
    after = await world.views()
    for cp in _cps(env):
        assert after[cp] == {"issuing": ca_fingerprint(new), "trusted": [ca_fingerprint(new)]}, cp
    assert all(v["trusted"] == [] for m, v in after.items() if m not in _cps(env))
    published = await world.published_until(lambda p: p.get(fake.NAME) == ca_fingerprint(new))
    # status.certificates in its own order, the target placed by its expiry rank (between the aggregator and etcd).
    assert list(published) == ["talos", "kubernetes", "kubernetes-aggregator", fake.NAME, "etcd"]
    assert await world.lease_holder() is None
    assert not [e for e in await world.events("TalosOperation") if e[0] == "Warning"]


async def test_a_fake_target_is_abandoned_when_deleted_while_abandonable(world: World) -> None:
    env = world.env
    old = world.bundle().ca(fake.NAME)
    await world.create("early")
    op = await world.run_until("early", lambda o: _ca(o).get("stage") == "Accepting")
    assert await world.lease_holder() == (op or {})["metadata"]["uid"]
    await crds.operations(world.kube).delete(env.namespace, "early")
    await world.run_until("early", lambda o: o is None)
    assert await world.lease_holder() is None
    assert names.ROTATION_KEY not in world.secret()
    assert world.bundle().ca(fake.NAME) == old  # secrets.yaml keeps the CA the rotation started from
    abandoned = [e for e in await world.events("TalosCluster") if e[1] == names.EventReason.OPERATION_ABANDONED]
    assert len(abandoned) == 1 and "Accepting" in abandoned[0][2], abandoned


async def test_a_fake_target_is_rotated_under_the_daemon_itself(env: SimEnvironment) -> None:
    """The whole daemon in this process (leader election, informers, the router, the supervisor and the cluster's
    mailbox actor), ichord's own registry of kinds: nothing steps the rotation but its own outcomes and the watch
    events they cause, and the bundle Secret's change reaches status.certificates through the router."""
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await _serve_fake_target_crds(kube)
        look = Look(env, kube)
        old = look.bundle().ca(fake.NAME)
        await look.create("daemon-rotate")
        async with running_daemon(env, kube, TIMING, identity="webhook-test"):
            op = await wait_until(lambda: look.op("daemon-rotate"),
                                  lambda o: _status(o).get("phase") == names.Phase.COMPLETED
                                  and not o["metadata"].get("finalizers"), within=300)
            new = look.bundle().ca(fake.NAME)
            published = await wait_until(look.published, lambda p: p.get(fake.NAME) == ca_fingerprint(new))
            holder = await look.lease_holder()
        after = await look.views()
        warnings = {kind: [e[1:] for e in await look.events(kind) if e[0] == "Warning"]
                    for kind in ("TalosOperation", "TalosCluster", "TalosMachine")}
    assert new != old and names.ROTATION_KEY not in look.secret()
    assert _status(op)["plan"]["targets"] == [fake.NAME] and _ca(op).get("stage") == "Done"
    [cert] = [c for c in _ca(op)["certificates"] if c["name"] == fake.NAME]
    assert (cert["previous"], cert["next"]) == (ca_fingerprint(old), ca_fingerprint(new))
    for cp in _cps(env):  # every control plane signs with and trusts the new CA alone; the worker carries none
        assert after[cp] == {"issuing": ca_fingerprint(new), "trusted": [ca_fingerprint(new)]}, cp
    assert all(v["trusted"] == [] for m, v in after.items() if m not in _cps(env))
    assert list(published) == ["talos", "kubernetes", "kubernetes-aggregator", fake.NAME, "etcd"]
    assert holder is None  # taken by the rotation, then released
    # No Warning for a step ichord planned; the one on the cluster asks a person for what only a person does: export
    # the bundle that now holds the new CA (docs/runbook.md).
    [(reason, message)] = warnings.pop("TalosCluster")
    assert reason == names.EventReason.BUNDLE_BACKUP_STALE and "daemon-rotate" in message, message
    assert warnings == {"TalosOperation": [], "TalosMachine": []}, warnings
