"""The pod model of the Kubernetes API simulator reproduces what hardware showed after a CA rotation
(docs/decisions.md#client-restarts): in-cluster clients keep the CA they started with, cilium taints its
Nodes, restarting everything at once breaks DNS, and a kubelet restart lags the Kubernetes CA change while the Node
still reads Ready."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind, generate_ca
from ichord.sim.combined import SimEnvironment
from ichord.sim.combined.addons import install_addons
from ichord.sim.combined.objects import render_machine
from ichord.sim.kube import BehaviourSettings, KubeSimulator, SimSettings
from ichord.sim.kube.podrules import CILIUM_TAINT
from ichord.sim.talos.config_view import read_config
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NODES = ("cp-1", "cp-2", "worker-1")
START = 0.05  # a pod's start delay
SETTINGS = BehaviourSettings(root_ca_publish_lag=0.05, projected_ca_lag=0.05, rollout_step=0.01, kubelet_restart=0.2,
                             ext_auth_recreate_lag=0.05, pod_start_delay=START, client_ca_reread=0.3)


@pytest.fixture
def sim_settings() -> SimSettings:
    return SimSettings(behaviours=dataclasses.replace(SETTINGS))


def ds_pods(sim: KubeSimulator, name: str) -> list[dict[str, Any]]:
    pods = sim.store.list(sim.store.resolve("", "v1", "pods"), "kube-system")[0]
    return [p for p in pods if p["metadata"]["ownerReferences"][0]["name"] == name]


def available(sim: KubeSimulator, plural: str, name: str) -> bool:
    obj = sim.store.get(sim.store.resolve("apps", "v1", plural), "kube-system", name)
    st, gen = obj.get("status") or {}, obj["metadata"]["generation"]
    if st.get("observedGeneration") != gen:
        return False
    if plural == "daemonsets":
        return bool(st["updatedNumberScheduled"] == st["numberAvailable"] == st["desiredNumberScheduled"] == len(NODES))
    return bool(st["updatedReplicas"] == st["availableReplicas"] == obj["spec"]["replicas"])


def restart(sim: KubeSimulator, plural: str, name: str, stamp: str) -> None:
    """kubectl rollout restart: a pod template annotation changes."""
    rt = sim.store.resolve("apps", "v1", plural)
    sim.store.patch(rt, "kube-system", name, "application/merge-patch+json", {"spec": {"template": {"metadata": {
        "annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}}})


async def cluster_with(sim: KubeSimulator, kube: KubeClient, cni: str) -> list[tuple[str, str]]:
    for i, name in enumerate(NODES):
        spec = {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]} \
            if name.startswith("cp") else {}
        body: dict[str, Any] = {"metadata": {"name": name}, "spec": spec, "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"10.5.0.{i + 2}"}]}}
        await kube.core().create_node(cast(Any, body))  # the client takes the JSON body as it is
    made = install_addons(sim.store, cni)
    await eventually(lambda: all(available(sim, p, n) for p, n in made))
    return made


async def switch_ca(sim: KubeSimulator) -> bytes:
    """What Issuing does to the API server: serve from the new CA, kube-root-ca.crt follows after a lag."""
    new = generate_ca(CAKind.KUBERNETES)
    await sim.switch_serving_ca(new)
    sim.behaviours.restart_controller_manager(new.cert_pem)
    return new.cert_pem


def root_ca_published(sim: KubeSimulator) -> bool:
    cm = sim.store.get(sim.store.resolve("", "v1", "configmaps"), "kube-system", "kube-root-ca.crt")
    return bool(cm["data"]["ca.crt"] == sim.behaviours.issuing_ca_pem.decode())


def failing(sim: KubeSimulator) -> set[str]:
    return {f["workload"] for f in sim.behaviours.pods.x509_failing()}


async def test_clients_keep_their_ca_until_restarted_and_kube_proxy_rereads(sim: KubeSimulator, kube: KubeClient,
                                                                             tmp_path: Path) -> None:
    pods = sim.behaviours.pods
    await cluster_with(sim, kube, "flannel")
    coredns_nodes = sorted(p["spec"]["nodeName"] for p in ds_pods(sim, "coredns"))
    assert coredns_nodes == ["cp-1", "cp-2"]  # 2 replicas, spread, tolerating the control-plane taint
    assert pods.dns_ok() and pods.resolves_new_services() and not pods.x509_failing()

    new = await switch_ca(sim)
    await eventually(lambda: failing(sim) == {"daemonsets/kube-flannel", "daemonsets/kube-proxy",
                                              "deployments/coredns"})
    failures = [e for e in pods.events if e["kind"] == "client_x509_failing"]
    assert len(failures) == 2 * len(NODES) + 2 and all("unknown authority" in e["error"] for e in failures)
    # flannel, kube-proxy and CoreDNS stay Running and Ready; CoreDNS answers but cannot learn new Services.
    assert all(available(sim, p, n) for p, n in (("daemonsets", "kube-flannel"), ("deployments", "coredns")))
    assert pods.dns_ok() and not pods.resolves_new_services()
    async with await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), trust=lambda: [new]) as admin:
        dep = await admin.apps().read_namespaced_deployment_status("coredns", "kube-system")
    assert dep.status.available_replicas == 2

    # A restart after kube-root-ca.crt carries the new CA cures CoreDNS; flannel, never restarted, still fails.
    await eventually(lambda: root_ca_published(sim))
    restart(sim, "deployments", "coredns", "t1")
    await eventually(lambda: "deployments/coredns" not in failing(sim) and available(sim, "deployments", "coredns"))
    assert pods.resolves_new_services()
    assert "daemonsets/kube-flannel" in failing(sim)
    # kube-proxy's client-go re-reads the refreshed ca.crt (client_ca_reread later); flannel never does.
    await eventually(lambda: "daemonsets/kube-proxy" not in failing(sim))
    assert any(e["kind"] == "client_x509_ended" and "re-read" in e["why"] for e in pods.events)
    assert failing(sim) == {"daemonsets/kube-flannel"}


async def test_cilium_taints_nodes_and_coredns_restarted_first_stays_pending(sim: KubeSimulator,
                                                                             kube: KubeClient) -> None:
    pods = sim.behaviours.pods
    await cluster_with(sim, kube, "cilium")

    def tainted() -> list[str]:
        nodes = sim.store.list(sim.store.resolve("", "v1", "nodes"), None)[0]
        return sorted(n["metadata"]["name"] for n in nodes
                      if any(t["key"] == CILIUM_TAINT["key"] for t in n["spec"].get("taints") or []))

    assert tainted() == []
    mark = len(pods.events)
    await switch_ca(sim)
    await eventually(lambda: tainted() == sorted(NODES))
    assert not available(sim, "daemonsets", "cilium") and not available(sim, "deployments", "cilium-operator")
    assert {"daemonsets/cilium", "deployments/cilium-operator"} <= failing(sim)
    assert not pods.dns_ok()  # no Ready agent under the CoreDNS pods: DNS broken, as on hardware

    # CoreDNS first (the order written for flannel): its new pod finds no Node it tolerates.
    await eventually(lambda: root_ca_published(sim))
    restart(sim, "deployments", "coredns", "t1")
    await eventually(lambda: any(p["status"]["phase"] == "Pending" and not p["spec"].get("nodeName")
                                 for p in ds_pods(sim, "coredns")))
    for _ in range(20):  # stays Pending however long we look (20 start delays)
        assert not available(sim, "deployments", "coredns")
        await anyio.sleep(START)
    # Restarting cilium (the CNI first) lifts the taint, and the Pending CoreDNS pod is scheduled.
    restart(sim, "daemonsets", "cilium", "t2")
    restart(sim, "deployments", "cilium-operator", "t2")
    await eventually(lambda: tainted() == [] and available(sim, "daemonsets", "cilium"))
    await eventually(lambda: available(sim, "deployments", "coredns") and available(sim, "deployments",
                                                                                    "cilium-operator"))
    assert pods.dns_ok() and pods.resolves_new_services()
    taints = [e["present"] for e in pods.events[mark:] if e["kind"] == "node_taint" and e["on_node"] == "cp-1"]
    assert taints == [True, False]


async def test_restarting_everything_at_once_breaks_dns_one_at_a_time_does_not(sim: KubeSimulator,
                                                                               kube: KubeClient) -> None:
    pods = sim.behaviours.pods
    made = await cluster_with(sim, kube, "flannel")
    assert pods.dns_outages == []
    for plural, name in made:  # CNI, kube-proxy and CoreDNS at the same moment
        restart(sim, plural, name, "all")
    await eventually(lambda: all(available(sim, p, n) for p, n in made) and pods.dns_ok())
    assert len(pods.dns_outages) >= 1 and all(o["end"] is not None for o in pods.dns_outages)
    outages = len(pods.dns_outages)
    for plural, name in made:  # the CNI, kube-proxy, CoreDNS, each after the previous is available
        restart(sim, plural, name, "one")
        await eventually(lambda p=plural, n=name: available(sim, p, n))  # type: ignore[misc]
    assert len(pods.dns_outages) == outages


async def test_pods_lose_ready_while_their_kubelet_restarts(sim: KubeSimulator, kube: KubeClient) -> None:
    await cluster_with(sim, kube, "flannel")
    sim.behaviours.restart_kubelet("cp-1")
    await eventually(lambda: not available(sim, "deployments", "coredns"))
    dep = await kube.apps().read_namespaced_deployment_status("coredns", "kube-system")
    assert dep.status.available_replicas == 1  # CoreDNS lost the replica on cp-1
    await eventually(lambda: available(sim, "deployments", "coredns"))


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


async def test_stale_ready_the_kubelet_restarts_after_a_lag(bundle: SecretsBundle) -> None:
    other = generate_bundle()
    async with SimEnvironment(bundle=bundle, control_planes=1, workers=1, time_scale=0.01, addons=True,
                              pod_start_delay=5.0, kubelet_restart_lag=30.0) as env:
        worker = env.machine_names[1]
        node = env.node(worker)
        cfg = render_machine(other, env.cluster_name, env.cluster_spec, env.machine_specs[worker])
        node.set_running(cfg, read_config(cfg))
        await eventually(lambda: bool(env.talos.history.of("kubelet_restart_scheduled", node.name)))
        assert env.node_ready(worker) == "True"  # stale: the kubelet has not restarted yet
        assert node.kubelet_restarts_pending == 1 and env.clients.dns_ok()
        await eventually(lambda: env.node_ready(worker) == "False")
        await eventually(lambda: not env.workload_available("deployments", "coredns"))  # lost a replica
        await eventually(lambda: env.node_ready(worker) == "True" and env.workload_available("deployments", "coredns"))
        kinds = [e["kind"] for e in env.talos.history.events if e["node"] in (node.name, None)]
        assert kinds.index("kubelet_restart_scheduled") < kinds.index("kubelet_restart")
