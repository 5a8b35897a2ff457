"""Issue 39: the TalosCluster tells the truth about its machines and its bundle (docs/decisions.md#bundle-belongs).

On the simulators, through the cluster actor's step over informers: machines that are not Ready make the cluster
not Ready (counted, named, with their reasons); another cluster's bundle swapped into the bundle Secret is
``Ready=False/BundleMismatch`` naming the bundle's CA fingerprint and the one the nodes trust, nothing reaches the
nodes (their own history), BundleBackupStale no longer claims the saved copy matches and the export refuses to
save that bundle; putting the cluster's own bundle back makes it Ready again.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.actors.cluster import ClusterReconciler
from ichord.actors.cluster_ready import bundle_cas
from ichord.actors.standalone import standalone_actor
from ichord.api import names
from ichord.api.conditions import Condition, find, set_condition
from ichord.cluster_cli import BundleNotTrusted, bundle_export
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.status import update_status
from ichord.operation_cli import Refused
from ichord.operations.bundle_source import read_bundle_secret
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.operations.config.cli import config_apply
from ichord.operations.outcome import next_delay
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.fingerprint import ca_fingerprint, export_fingerprint
from ichord.pki.rotation import Target
from ichord.render.trusted_cas import NodeTrust, refusals
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def other() -> SecretsBundle:
    """Cluster B's bundle: what gets swapped into cluster A's Secret."""
    return generate_bundle()


async def _cluster(kube: KubeClient, env: SimEnvironment) -> Obj:
    return await crds.clusters(kube).get(env.namespace, env.cluster_name)


def _ready(obj: Obj) -> Obj:
    return find((obj.get("status") or {}).get("conditions"), names.READY) or {}


async def _machine_ready(kube: KubeClient, env: SimEnvironment, name: str) -> Obj:
    return _ready(await crds.machines(kube).get(env.namespace, name))


async def _put_bundle(kube: KubeClient, env: SimEnvironment, bundle: SecretsBundle) -> None:
    """Replace secrets.yaml in the cluster's bundle Secret (a restore from the wrong file, a copy-paste)."""
    data = base64.b64encode(bundle.to_yaml().encode()).decode()
    await kube.raw("PATCH", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}",
                   body={"data": {names.SECRETS_KEY: data}}, content_type="application/merge-patch+json")


async def _caught_up(kube: KubeClient, reconciler: ClusterReconciler, env: SimEnvironment) -> None:
    """The actor's informer holds every machine as the server does (this step's own status writes)."""
    served = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
              for o in (await crds.machines(kube).list_objects(env.namespace))[0]}
    machines = reconciler.rt.machines
    await eventually(lambda: all((machines.get(env.namespace, n) or {}).get("metadata", {}).get(
        "resourceVersion") == rv for n, rv in served.items()))


def _applies(env: SimEnvironment) -> dict[str, int]:
    return {name: len(env.applies(name)) for name in env.machine_names}


# ---- machines not Ready ------------------------------------------------------------------------


async def test_every_machine_invalid_config_makes_the_cluster_not_ready(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await crds.clusters(kube).patch(env.namespace, env.cluster_name,
                                        {"spec": {"patches": ["machine:\n  nonsense: 1\n"]}})
        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
            await reconciler.step({})
            ready = _ready(await _cluster(kube, env))
            cps = [n for n in env.machine_names if "-cp-" in n]
            assert (ready["status"], ready["reason"]) == ("False", names.ReadyReason.MACHINES_NOT_READY), ready
            # Counted, a few named with their reasons, then the rest counted: bounded however large the cluster.
            assert ready["message"].startswith(
                f"4 of 4 machines not Ready: {cps[0]} InvalidConfig, {cps[1]} InvalidConfig, {cps[2]} InvalidConfig "
                f"and 1 more;"), ready["message"]
            assert f"kubectl -n {env.namespace} get tm" in ready["message"]

            await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": []}})
            await eventually(lambda: not ((reconciler.rt.clusters.get(env.namespace, env.cluster_name) or {})
                                          .get("spec") or {}).get("patches"))
            await reconciler.step({("TalosCluster", env.cluster_name): "MODIFIED"})
            ready = _ready(await _cluster(kube, env))
            assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready


async def test_an_unreachable_node_makes_the_cluster_not_ready(env: SimEnvironment) -> None:
    worker = next(n for n in env.machine_names if "-worker-" in n)
    await env.set_unreachable(worker)
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
        await reconciler.step({})
        ready = _ready(await _cluster(kube, env))
        assert (ready["status"], ready["reason"]) == ("False", names.ReadyReason.MACHINES_NOT_READY), ready
        assert ready["message"].startswith(f"1 of 4 machines not Ready: {worker} Unreachable;"), ready["message"]

        await env.set_unreachable(worker, False)
        for _ in range(200):  # the worker is read again at its retry (timing.retry, scaled)
            await reconciler.step({})
            ready = _ready(await _cluster(kube, env))
            if ready.get("status") == "True":
                break
            await anyio.sleep(0.02)
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready


# ---- another cluster's bundle -------------------------------------------------------------------


def _swapped(own: SecretsBundle, other: SecretsBundle, what: str) -> SecretsBundle:
    return other if what == "whole bundle" else own.with_cas({CAKind.KUBERNETES: other.k8s})


async def _exported(kube: KubeClient, env: SimEnvironment, reconciler: ClusterReconciler,
                    bundle: SecretsBundle) -> None:
    """BundleBackupStale as a rotation raises it, then lowered by the export annotation: "the saved copy matches"."""
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"metadata": {"annotations": {
        names.BUNDLE_EXPORTED_ANNOTATION: export_fingerprint(bundle)}}})

    def raised(status: Obj, _obj: Obj) -> Obj:
        status["conditions"] = set_condition(status.get("conditions"), Condition(
            names.BUNDLE_BACKUP_STALE, "True", names.BundleBackupStaleReason.CA_ROTATED, "rotated"))
        return status

    await update_status(crds.clusters(kube), env.namespace, env.cluster_name, raised)
    await eventually(lambda: names.BUNDLE_EXPORTED_ANNOTATION in (
        (reconciler.rt.clusters.get(env.namespace, env.cluster_name) or {}).get("metadata", {}).get("annotations")
        or {}))
    await reconciler.step({("TalosCluster", env.cluster_name): "MODIFIED"})
    stale = find((await _cluster(kube, env))["status"]["conditions"], names.BUNDLE_BACKUP_STALE) or {}
    assert (stale.get("status"), stale.get("reason")) == ("False", "BundleExported"), stale


@pytest.mark.parametrize("what", ["whole bundle", "kubernetes CA only"])
async def test_another_clusters_bundle_is_refused_and_nothing_reaches_the_nodes(
        env: SimEnvironment, other: SecretsBundle, tmp_path: Path, what: str) -> None:
    assert env.bundle is not None
    own = env.bundle
    swapped = _swapped(own, other, what)
    secret_changed = {("Secret", env.secret_name): "MODIFIED"}
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
        await reconciler.step({})
        assert _ready(await _cluster(kube, env))["status"] == "True"
        await _exported(kube, env, reconciler, own)
        await _caught_up(kube, reconciler, env)  # each machine's status.trustedCAs, as the step read its node
        applies = _applies(env)

        await _put_bundle(kube, env, swapped)
        await reconciler.step(secret_changed)
        cluster = await _cluster(kube, env)
        ready = _ready(cluster)
        assert (ready["status"], ready["reason"]) == ("False", names.ReadyReason.BUNDLE_MISMATCH), ready
        # Both fingerprints named: the bundle's CA and the one the nodes trust (never a key).
        ca = "Kubernetes CA" if what != "whole bundle" else "Talos API CA"
        mine, theirs = (own.k8s, swapped.k8s) if what != "whole bundle" else (own.os, swapped.os)
        assert f"its {ca} {ca_fingerprint(theirs)} is not among the CAs the nodes trust ({ca_fingerprint(mine)})" \
            in ready["message"], ready["message"]
        assert "4 of 4 machines refuse it" in ready["message"], ready["message"]
        assert "kubectl apply" in ready["message"]
        assert "PRIVATE KEY" not in str(cluster) and swapped.os.key_pem is not None
        assert swapped.os.key_pem.decode() not in str(cluster)
        for name in env.machine_names:
            machine = await _machine_ready(kube, env, name)
            assert (machine["status"], machine["reason"]) == ("False", "BundleMismatch"), machine
        assert _applies(env) == applies  # the nodes' own history: nothing was applied to any of them
        stale = find(cluster["status"]["conditions"], names.BUNDLE_BACKUP_STALE) or {}
        assert (stale.get("status"), stale.get("reason")) == ("Unknown", "BundleMismatch"), stale
        events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        assert [e["type"] for e in events if e["reason"] == "BundleMismatch"] == ["Warning"]

        # The export refuses to save the bundle the nodes refuse: the good copy stays, the annotation too.
        saved = tmp_path / "secrets.yaml"
        with pytest.raises(BundleNotTrusted, match="BundleMismatch"):
            await bundle_export(kube, env.cluster_name, namespace=env.namespace, output=saved)
        assert not saved.exists()
        annotations = (await _cluster(kube, env))["metadata"]["annotations"]
        assert annotations[names.BUNDLE_EXPORTED_ANNOTATION] == export_fingerprint(own)

        # A step later (not due, or read again) still says the same and still applies nothing.
        await reconciler.step(secret_changed)
        assert _ready(await _cluster(kube, env))["reason"] == names.ReadyReason.BUNDLE_MISMATCH
        assert _applies(env) == applies

        await _put_bundle(kube, env, own)
        await reconciler.step(secret_changed)
        cluster = await _cluster(kube, env)
        ready = _ready(cluster)
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready
        stale = find(cluster["status"]["conditions"], names.BUNDLE_BACKUP_STALE) or {}
        assert (stale.get("status"), stale.get("reason")) == ("False", "BundleExported"), stale
        for name in env.machine_names:
            assert (await _machine_ready(kube, env, name))["reason"] == "Converged"
        assert _applies(env) == applies


@pytest.mark.parametrize("kind", [CAKind.ETCD, CAKind.AGGREGATOR], ids=["etcd CA only", "aggregator CA only"])
async def test_another_clusters_etcd_or_aggregator_ca_is_refused_on_the_control_planes(
        env: SimEnvironment, other: SecretsBundle, kind: CAKind) -> None:
    """Only the etcd (or the aggregator) CA swapped: the control planes would have rebooted (restarted their
    kube-apiserver) into it, one by one, under a config rollout. They refuse it instead, naming both fingerprints;
    the worker carries neither CA and stays Converged; nothing is applied and config-apply creates nothing."""
    assert env.bundle is not None
    own = env.bundle
    swapped = own.with_cas({kind: other.ca(kind)})
    title = "etcd CA" if kind is CAKind.ETCD else "Kubernetes aggregator (front-proxy) CA"
    cps = [n for n in env.machine_names if "-cp-" in n]
    secret_changed = {("Secret", env.secret_name): "MODIFIED"}
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
        await reconciler.step({})
        assert _ready(await _cluster(kube, env))["status"] == "True"
        await _caught_up(kube, reconciler, env)
        applies = _applies(env)

        await _put_bundle(kube, env, swapped)
        await reconciler.step(secret_changed)
        ready = _ready(await _cluster(kube, env))
        assert (ready["status"], ready["reason"]) == ("False", names.ReadyReason.BUNDLE_MISMATCH), ready
        assert f"its {title} {ca_fingerprint(other.ca(kind))} is not among the CAs the nodes trust " \
               f"({ca_fingerprint(own.ca(kind))})" in ready["message"], ready["message"]
        assert f"{len(cps)} of {len(env.machine_names)} machines refuse it" in ready["message"], ready["message"]
        for name in env.machine_names:
            machine = await crds.machines(kube).get(env.namespace, name)
            want = "BundleMismatch" if name in cps else "Converged"
            assert _ready(machine)["reason"] == want, (name, _ready(machine))
            if name in cps:
                assert f"the bundle's {title} {ca_fingerprint(other.ca(kind))}" in _ready(machine)["message"]
                # Never classified as a change: no reboot nor restart left for a rollout to plan.
                assert (machine["status"]["rebootPaths"], machine["status"]["apiServerRestartPaths"]) == ([], [])
        assert _applies(env) == applies

        await _caught_up(kube, reconciler, env)
        with pytest.raises(Refused, match="BundleMismatch"):
            await config_apply(kube, env.cluster_name, env.namespace, wait=0)
        assert (await crds.operations(kube).list_objects(env.namespace))[0] == []  # nothing created

        await _put_bundle(kube, env, own)
        await reconciler.step(secret_changed)
        ready = _ready(await _cluster(kube, env))
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready
        assert _applies(env) == applies


# ---- a CA rotation is no mismatch ---------------------------------------------------------------

#: The rotation tests' bounds (_ca_rotation_driver.TIMING), at the census test's scale.
ROTATION_TIMING = replace(Timing().scaled(0.01), ca_client_restart_timeout=30.0, ca_apiserver_unchanged=2.0,
                          ca_apiserver_ready_bound=30.0)


@pytest.mark.parametrize("target", ["talos", "etcd", "kubernetes-aggregator"])
async def test_a_ca_rotation_under_way_never_trips_bundle_mismatch(env: SimEnvironment, target: str) -> None:
    """A CA rotation (Talos API, etcd, aggregator) through the actor: at every step the cluster and its machines
    never say BundleMismatch, and at every stage each node trusts a CA of the bundle Secret as the actor compares
    them (secrets.yaml's or rotation.yaml's: from Dropping on the nodes trust the new CA alone while secrets.yaml
    still holds the old)."""
    assert env.bundle is not None
    kind = Target(target).ca_kind
    field = Target(target).rotation_key  # status.trustedCAs's key: rotation.yaml's
    old = ca_fingerprint(env.bundle.ca(kind))
    async with await from_kubeconfig(env.kubeconfig, timing=ROTATION_TIMING) as kube, \
            standalone_actor(kube, env.namespace, env.cluster_name, ROTATION_TIMING, instance="test") as reconciler:
        await reconciler.step({})
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CA_ROTATION,
            "caRotation": {"targets": [target]}}})
        stages: list[str] = []
        for _ in range(3000):
            outcome = await reconciler.step({})
            op = await crds.operations(kube).get(env.namespace, "rotate")
            status = op.get("status") or {}
            stage = str((status.get("caRotation") or {}).get("stage") or "")
            if stage == "AwaitingCredentials":  # the operator's hand-off (ichord cluster credentials --acknowledge)
                token = handoff_token(status["caRotation"]["certificates"])
                await crds.operations(kube).patch(env.namespace, "rotate", {"metadata": {"annotations": {
                    names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
            cluster = await _cluster(kube, env)
            assert _ready(cluster).get("reason") != names.ReadyReason.BUNDLE_MISMATCH, _ready(cluster)
            for name in env.machine_names:
                assert (await _machine_ready(kube, env, name)).get("reason") != "BundleMismatch", name
            if stage and (not stages or stages[-1] != stage):
                stages.append(stage)
            read = await read_bundle_secret(kube, env.namespace, env.secret_name)
            cas = bundle_cas(read, read.full())
            for name in env.machine_names:
                trust = NodeTrust.of_config(env.node(name).running.plain())
                assert refusals(cas, trust) == (), (stage, name, trust, cas)
            if status.get("phase") == names.Phase.COMPLETED:
                break
            await anyio.sleep(min(max(next_delay(outcome) or 0.01, 0.005), 0.1))
        assert stages[0] == "Accepting" and "Dropping" in stages and stages[-1] == "Done", stages

        new = ca_fingerprint(SecretsBundle.from_yaml(
            (await read_bundle_secret(kube, env.namespace, env.secret_name)).raw).ca(kind))
        assert new != old
        for _ in range(200):  # after Done the machines are read again with the new CA: Ready, trusting it alone
            await reconciler.step({})
            machines = [await crds.machines(kube).get(env.namespace, n) for n in env.machine_names]
            if all(_ready(m).get("reason") == "Converged" for m in machines):
                break
            await anyio.sleep(0.02)
        # The etcd and aggregator CAs are a control plane's alone: a worker trusts none of them.
        assert [m["status"]["trustedCAs"][field] for m in machines] == [
            [new] if target == "talos" or "-cp-" in m["metadata"]["name"] else [] for m in machines]
        ready = _ready(await _cluster(kube, env))
        assert (ready["status"], ready["reason"]) == ("True", "Reconciled"), ready


async def test_a_machine_refusing_the_bundle_leaves_no_reboot_for_a_rollout_to_plan(
        env: SimEnvironment, other: SecretsBundle) -> None:
    """A reboot waiting for its rollout (rebootPaths) when the Kubernetes CA of another cluster lands in the Secret:
    the reports go, so a config rollout planned from them cannot roll the other cluster's CA out to the nodes."""
    assert env.bundle is not None
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as reconciler:
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [
            "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n"]}})
        await eventually(lambda: ((reconciler.rt.clusters.get(env.namespace, env.cluster_name) or {})
                                  .get("spec") or {}).get("patches"))
        await reconciler.step({})
        waiting = await crds.machines(kube).get(env.namespace, env.machine_names[-1])
        assert _ready(waiting)["reason"] == "RebootRequired" and waiting["status"]["rebootPaths"]
        await _caught_up(kube, reconciler, env)
        applies = _applies(env)

        await _put_bundle(kube, env, env.bundle.with_cas({CAKind.KUBERNETES: other.k8s}))
        await reconciler.step({("Secret", env.secret_name): "MODIFIED"})
        for name in env.machine_names:
            machine = await crds.machines(kube).get(env.namespace, name)
            assert _ready(machine)["reason"] == "BundleMismatch", _ready(machine)
            assert (machine["status"]["rebootPaths"], machine["status"]["apiServerRestartPaths"]) == ([], [])
        assert _applies(env) == applies
