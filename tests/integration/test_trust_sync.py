"""The trust sync on the real wire: an Accepting status publishes the new Kubernetes CA within moments,
the client then survives the serving-CA switch, and with no rotation under way the extras go once the
base file trusts the newest CA."""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from ichord.api.names import ROTATION_KEY, SECRETS_KEY
from ichord.contract import V1_14
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import TLSVerificationError
from ichord.kube.reads import read_config_map
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.settings import Timing
from ichord.sim.combined.objects import cluster_spec
from ichord.sim.kube import KubeSimulator
from ichord.trust.pool import TrustPool
from ichord.trust.sync import TrustSync
from ichord.watchers import Informer, Resource
from ichord.watchers.informer import WatchEvent
from tests.integration._kube_helpers import eventually, fast_bookmarks

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

NS, CONTROLLER_NS, SECRET = "default", "ichord-system", "c1-secrets"
TIMING = dataclasses.replace(Timing().scaled(0.01), kube_request_timeout=5.0, min_call_timeout=5.0)
OPERATIONS = Resource(crds.GROUP, crds.VERSION, "talosoperations")


@dataclasses.dataclass
class World:
    sim: KubeSimulator
    kube: KubeClient
    pool: TrustPool
    base: Path
    trust_file: Path
    rotation: Rotation


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    rotation = generate_rotation((Target.TALOS, Target.KUBERNETES))
    async with KubeSimulator(fast_bookmarks()) as sim:
        store = sim.store
        store.create(store.resolve("", "v1", "namespaces"), None, {"metadata": {"name": CONTROLLER_NS}})
        store.create(store.resolve("", "v1", "secrets"), CONTROLLER_NS, {
            "metadata": {"name": SECRET, "namespace": CONTROLLER_NS}, "type": "Opaque",
            "data": {ROTATION_KEY: base64.b64encode(rotation.to_yaml().encode()).decode(),
                     # the cluster's current Kubernetes CA is the one its API server (and ca.crt) serves from
                     SECRETS_KEY: base64.b64encode(current_ca_yaml(sim.ca_pem)).decode()}})
        store.create(store.resolve(crds.GROUP, crds.VERSION, "talosclusters"), NS, {
            "apiVersion": crds.API_VERSION, "kind": "TalosCluster", "metadata": {"name": "c1", "namespace": NS},
            # The Secret in the controller namespace, the cluster in another: allowed by the administrator.
            "spec": {**cluster_spec(secret=SECRET, endpoint=sim.url, contract=V1_14, cni="flannel"),
                     "secretsRef": {"name": SECRET, "namespace": CONTROLLER_NS}}})
        base = tmp_path / "ca.crt"  # the pod's projected ca.crt
        base.write_bytes(sim.ca_pem)
        pool = TrustPool(base)
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kubeconfig"), trust=pool.source, timing=TIMING)
        try:
            yield World(sim, kube, pool, base, tmp_path / "trust" / "kubernetes-ca.crt", rotation)
        finally:
            await kube.close()


def current_ca_yaml(ca_pem: bytes) -> bytes:
    """The part of secrets.yaml the sync reads (certs.k8s.crt); nothing else of the bundle is needed."""
    return f"certs:\n  k8s:\n    crt: {base64.b64encode(ca_pem).decode()}\n".encode()


def sync_of(w: World, tick: float) -> TrustSync:
    return TrustSync(w.kube, w.pool, allowed_secret_namespaces=frozenset({CONTROLLER_NS}), trust_file=w.trust_file,
                     timing=dataclasses.replace(TIMING, trust_sync_tick=tick))


def put_operation(sim: KubeSimulator, name: str, cluster: str, stage: str) -> None:
    ops = sim.store.resolve(crds.GROUP, crds.VERSION, "talosoperations")
    obj = sim.store.create(ops, NS, {"apiVersion": crds.API_VERSION, "kind": "TalosOperation",
                                     "metadata": {"name": name, "namespace": NS},
                                     "spec": {"clusterRef": {"name": cluster}, "kind": "ca-rotation"}})
    obj["status"] = {"phase": "InProgress", "caRotation": {"stage": stage}}
    sim.store.apply(ops, obj, subresource="status")


async def set_status(kube: KubeClient, status: dict[str, Any]) -> None:
    await crds.operations(kube).patch_status(NS, "rotate", {"status": status})


async def test_accepting_publishes_at_once_and_the_client_survives_the_switch(world: World) -> None:
    w = world
    sync = sync_of(w, tick=60.0)  # no tick within the test: only events can publish
    informer = Informer(w.kube, OPERATIONS, timing=TIMING, handlers=[sync.on_operation])
    new_k8s = w.rotation.new[Target.KUBERNETES]
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        tg.start_soon(sync.run)
        await informer.wait_synced()
        await crds.operations(w.kube).create(NS, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": "c1"}, "kind": "ca-rotation"}})
        await eventually(lambda: informer.get(NS, "rotate") is not None)
        await anyio.sleep(0.1)
        assert sync.passes == 0 and not w.trust_file.exists()  # the creation event is ignored

        with structlog.testing.capture_logs() as logs:
            written = time.monotonic()
            await set_status(w.kube, {"phase": "InProgress", "caRotation": {"stage": "Accepting"}})
            await eventually(w.trust_file.exists, within=5)
            latency = time.monotonic() - written
        assert latency < 1.0, latency
        assert w.trust_file.read_bytes() == new_k8s.cert_pem  # the certificate, never the key
        assert sync.passes == 1
        [line] = [e for e in logs if e["event"] == "trusting an extra Kubernetes CA"]
        assert line["subject"] == new_k8s.certificate.subject.rfc4514_string()
        assert "BEGIN" not in repr(logs)

        # Issuing: the API server now serves from the new CA; the base file still holds the old one.
        await w.sim.switch_serving_ca(new_k8s)
        assert (await read_config_map(w.kube, "default", "kube-root-ca.crt"))["data"]
        cut = TrustPool(w.base)  # the same client without the pool's extras fails x509
        bare = await from_kubeconfig(w.sim.write_kubeconfig(w.base.parent / "k2"), trust=cut.source, timing=TIMING)
        try:
            with pytest.raises(TLSVerificationError):
                await read_config_map(bare, "default", "kube-root-ca.crt")
        finally:
            await bare.close()

        # Completed with the base still lagging: the extras stay.
        await set_status(w.kube, {"phase": "Completed", "caRotation": {"stage": "Done"}})
        await eventually(lambda: sync.passes >= 2, within=5)  # the Completed event
        assert w.pool.extras == [new_k8s.cert_pem] and w.trust_file.exists()
        # The kubelet refreshes ca.crt: the next pass clears, and the base alone trusts the API server.
        w.base.write_bytes(new_k8s.cert_pem)
        sync.request()
        await eventually(lambda: not w.trust_file.exists(), within=5)
        assert w.pool.extras == []
        assert (await read_config_map(w.kube, "default", "kube-root-ca.crt"))["data"]
        tg.cancel_scope.cancel()


async def test_an_events_rotation_is_published_before_the_list_which_settles_the_rest(world: World) -> None:
    """The event is the operation as written: its rotation is trusted without waiting for the uncached LIST (a round
    trip on the way to the publish); the LIST still decides everything else, and alone may clear."""
    w = world
    sync = sync_of(w, tick=60.0)
    ops = w.sim.store.resolve(crds.GROUP, crds.VERSION, "talosoperations")
    put_operation(w.sim, "rotate", "c1", "Accepting")
    sync.on_operation(WatchEvent("MODIFIED", w.sim.store.get(ops, NS, "rotate"), None))
    w.sim.faults.error_rate = {"list": 1.0}  # the LIST fails: the event's rotation is published all the same
    result = await sync.pass_once()
    assert result.published and result.failed and result.trusted == 1
    assert w.trust_file.read_bytes() == w.rotation.new[Target.KUBERNETES].cert_pem
    assert w.sim.requests.count("list", 500) >= 1 and w.sim.requests.count("list", 200) == 0

    w.sim.faults.error_rate = {}
    result = await sync.pass_once()  # no event: the LIST alone, and the rotation counted once
    assert result.underway == 1 and result.trusted == 1 and not result.failed and not result.published


async def test_the_tick_publishes_without_events_and_bad_inputs_do_not_stop_it(world: World) -> None:
    w = world
    # Written straight into the store: no informer, no event reaches the sync; only its tick can act.
    put_operation(w.sim, "rotate", "c1", "Issuing")
    # A second rotation naming a cluster that does not exist: logged, the first is still published.
    put_operation(w.sim, "orphan", "nope", "Accepting")
    sync = sync_of(w, tick=0.05)
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sync.run)
            await eventually(w.trust_file.exists, within=5)
            tg.cancel_scope.cancel()
    assert w.trust_file.read_bytes() == w.rotation.new[Target.KUBERNETES].cert_pem
    assert any(e["event"] == "trust sync cannot read the rotation's new Kubernetes CA"
               and e["operation"] == f"{NS}/orphan" for e in logs)

    # rotation.yaml corrupted: the pass reports it (without the content) and keeps what it trusts.
    secrets = w.sim.store.resolve("", "v1", "secrets")
    obj = w.sim.store.get(secrets, CONTROLLER_NS, SECRET)
    obj["data"][ROTATION_KEY] = base64.b64encode(b"kubernetes: {crt: 'bm90IHBlbQ=='}").decode()
    w.sim.store.apply(secrets, obj)
    result = await sync.pass_once()
    assert result.failed and result.underway == 2 and w.pool.extras == [w.rotation.new[Target.KUBERNETES].cert_pem]

    # The API unreachable: the pass fails softly, nothing changes.
    async with w.sim.outage():
        result = await sync.pass_once()
    assert result.failed and w.trust_file.exists()


async def test_a_second_rotation_drops_the_first_ones_ca_once_the_base_trusts_the_newest(world: World) -> None:
    """Rotation 1 completed while the projected ca.crt lagged (its CA kept); rotation 2 adds its own; once
    rotation 2 is done and the base carries its CA, both extras go: the first CA is trusted no more."""
    w = world
    first = w.rotation.new[Target.KUBERNETES]
    put_operation(w.sim, "rotate", "c1", "Issuing")
    sync = sync_of(w, tick=60.0)
    await sync.pass_once()
    assert w.pool.extras == [first.cert_pem]
    await w.sim.switch_serving_ca(first)  # rotation 1's Issuing
    await set_status(w.kube, {"phase": "Completed", "caRotation": {"stage": "Done"}})
    assert (await sync.pass_once()).cleared is False  # the base still holds the old CA only

    second_rotation = generate_rotation((Target.KUBERNETES,))
    second = second_rotation.new[Target.KUBERNETES]
    secrets = w.sim.store.resolve("", "v1", "secrets")
    obj = w.sim.store.get(secrets, CONTROLLER_NS, SECRET)
    obj["data"][ROTATION_KEY] = base64.b64encode(second_rotation.to_yaml().encode()).decode()
    # rotation 1's Finalizing replaced the bundle: its CA is the current one; the base still lags behind it
    obj["data"][SECRETS_KEY] = base64.b64encode(current_ca_yaml(first.cert_pem)).decode()
    w.sim.store.apply(secrets, obj)
    put_operation(w.sim, "rotate-again", "c1", "Accepting")
    result = await sync.pass_once()
    assert result.published and w.pool.extras == [first.cert_pem, second.cert_pem]
    assert w.trust_file.read_bytes() == first.cert_pem + second.cert_pem

    w.base.write_bytes(first.cert_pem)  # the base caught up with rotation 1 only: rotation 2 still under way
    assert (await sync.pass_once()).cleared is False
    await w.sim.switch_serving_ca(second)  # rotation 2's Issuing: trusted through the pool alone
    await crds.operations(w.kube).patch_status(NS, "rotate-again", {"status": {
        "phase": "Completed", "caRotation": {"stage": "Done"}}})
    assert (await sync.pass_once()).cleared is False  # none under way, but the base lacks the newest
    w.base.write_bytes(second.cert_pem)
    assert (await sync.pass_once()).cleared is True
    assert w.pool.extras == [] and not w.trust_file.exists()
    assert w.pool.source() == [second.cert_pem]  # the first rotation's CA is trusted no more


async def test_another_clusters_rotation_is_not_trusted(world: World) -> None:
    """A rotation of a cluster whose API server this process does not use: its CA could never reach ca.crt,
    so the pool would keep it for ever; the sync leaves it out and still serves its own cluster's."""
    w = world
    other = generate_rotation((Target.KUBERNETES,))
    other_current = generate_rotation((Target.KUBERNETES,)).new[Target.KUBERNETES]
    store = w.sim.store
    store.create(store.resolve("", "v1", "secrets"), CONTROLLER_NS, {
        "metadata": {"name": "c2-secrets", "namespace": CONTROLLER_NS}, "type": "Opaque",
        "data": {ROTATION_KEY: base64.b64encode(other.to_yaml().encode()).decode(),
                 SECRETS_KEY: base64.b64encode(current_ca_yaml(other_current.cert_pem)).decode()}})
    store.create(store.resolve(crds.GROUP, crds.VERSION, "talosclusters"), NS, {
        "apiVersion": crds.API_VERSION, "kind": "TalosCluster", "metadata": {"name": "c2", "namespace": NS},
        "spec": {**cluster_spec(secret="c2-secrets", endpoint="https://127.0.0.9:6443", contract=V1_14,
                                cni="flannel"), "secretsRef": {"name": "c2-secrets", "namespace": CONTROLLER_NS}}})
    put_operation(w.sim, "rotate-c2", "c2", "Issuing")
    sync = sync_of(w, tick=60.0)
    result = await sync.pass_once()
    assert (result.underway, result.other_clusters, result.trusted) == (1, 1, 0)
    assert w.pool.extras == [] and not w.trust_file.exists()
    put_operation(w.sim, "rotate", "c1", "Accepting")  # our own cluster's rotation is still trusted
    result = await sync.pass_once()
    assert (result.underway, result.other_clusters, result.trusted) == (2, 1, 1)
    assert w.pool.extras == [w.rotation.new[Target.KUBERNETES].cert_pem]
