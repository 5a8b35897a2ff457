"""ichord's CA rotation against the simulator's in-cluster clients (docs/decisions.md#rotation-state's hardware
amendments).

Each observation is reproduced first (ichord's safeguard switched off or replaced by what hardware ran) and
then shown prevented by ichord's real Finalizing, in-process with the Driver, flannel and cilium:
(a) no client restarts: flannel/CoreDNS (cilium and its taint) keep failing x509 after Done;
(b) restarting all at once breaks DNS, ichord's one at a time does not;
(c) cilium: CoreDNS first never gets CoreDNS back (the taint), the CNI first does;
(d) stale Ready: without the kubelet settle delay the restarts start while kubelets are about to restart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.events import EventRecorder
from ichord.operations.ca_rotation import clients
from ichord.operations.ca_rotation.managed_objects import get_workload, patch_workload
from ichord.operations.outcome import Done
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.podrules import CILIUM_TAINT
from tests.integration._ca_rotation_driver import TIMING, Driver

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
SCALE = 0.02  # the environment's time scale
POD_START = 5.0  # unscaled: a pod is Ready 100 ms after it is scheduled
#: Unscaled: the kubelet restarts 1.8 s after its Kubernetes CA changed. Longer than ichord takes here from the
#: last Dropping apply to its first client restart (about 0.7 s measured), shorter than the settle delay below.
KUBELET_LAG = 90.0
#: The default 90 s settle delay at 1/20: ichord times it from a condition's one-second-resolution timestamp,
#: so it can end up to 1 s early; 4.5 s still outlasts the lag plus a kubelet restart plus a pod start by > 1 s.
SETTLE_SCALED = replace(TIMING, ca_kubelet_settle_delay=Timing().ca_kubelet_settle_delay / 20)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@dataclass
class Observed:
    env: SimEnvironment
    driver: Driver

    def events(self, kind: str) -> list[dict[str, Any]]:
        return self.env.talos.history.of(kind)

    @property
    def first_restart(self) -> dict[str, Any]:
        restarts = self.events("client_restart")
        assert restarts, "no client was restarted"
        return restarts[0]

    def outages_during_restarts(self) -> list[dict[str, Any]]:
        """DNS outages that began once the first client restart was issued."""
        return [e for e in self.events("dns_outage_start") if e["seq"] > self.first_restart["seq"]]

    def kubelet_restarts_after_first_client_restart(self) -> list[dict[str, Any]]:
        return [e for e in self.events("kubelet_restart") if e["seq"] > self.first_restart["seq"]]

    def tainted(self) -> list[str]:
        nodes = self.env.kube.store.list(self.env.kube.store.resolve("", "v1", "nodes"), None)[0]
        return sorted(n["metadata"]["name"] for n in nodes
                      if any(t["key"] == CILIUM_TAINT["key"] for t in (n.get("spec") or {}).get("taints") or []))

    def failing(self) -> set[str]:
        return {f["workload"] for f in self.env.clients.x509_failing()}

    @property
    def reason(self) -> str:
        cond = find(self.driver.snapshots[-1]["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None
        return str(cond["reason"])


@asynccontextmanager
async def rotated(bundle: SecretsBundle, cni: str, *, timing: Timing = TIMING,
                  kubelet_lag: float | None = None) -> AsyncIterator[Observed]:
    """A whole rotation of a 1+1 cluster (as on the cilium hardware) running its addons, driven to Done; the
    environment still up. CoreDNS's 2 replicas run one on each Node."""
    async with SimEnvironment(bundle=bundle, control_planes=1, workers=1, time_scale=SCALE, cni=cni, addons=True,
                              pod_start_delay=POD_START, kubelet_restart_lag=kubelet_lag) as env:
        assert env.clients.dns_ok() and env.clients.resolves_new_services() and not env.clients.x509_failing()
        trusted: list[bytes] = []
        base = bundle.k8s.cert_pem
        kube: KubeClient
        async with await from_kubeconfig(env.kubeconfig, trust=lambda: [base, *trusted]) as kube:
            recorder = EventRecorder(kube)
            async with anyio.create_task_group() as tg:
                tg.start_soon(recorder.run)
                driver = Driver(env, kube, recorder, trusted=trusted, timing=timing)
                await driver.create()
                assert isinstance(await driver.run(max_steps=2000), Done)
                await recorder.drain()
                tg.cancel_scope.cancel()
            yield Observed(env, driver)


def settling(op: dict[str, Any]) -> bool:
    cond = find((op.get("status") or {}).get("conditions") or [], names.CA_ROTATION)
    return cond is not None and cond.get("reason") == "SettlingNodes"


def no_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "sequence", lambda preset: ())


def all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the second hardware rotation ran: every client patched in one step, then waited for."""
    real = clients.restart_step

    async def step(kc: KubeClient, uid: str, seq: tuple[clients.Workload, ...], at: str) -> clients.Progress:
        progress = clients.Progress(done=False)
        for w in seq:
            obj = await get_workload(kc, w.plural, clients.NAMESPACE, w.name)
            if obj is not None and not clients.carries(obj, uid):
                await patch_workload(kc, w.plural, clients.NAMESPACE, w.name, clients.restart_patch(uid, at))
                progress.restarted.append(str(w))
        return progress if progress.restarted else await real(kc, uid, seq, at)

    monkeypatch.setattr(clients, "restart_step", step)


def coredns_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """The order written for flannel (before the 2026-10-29 amendment): CoreDNS, kube-proxy, the CNI."""
    real = clients.sequence
    monkeypatch.setattr(clients, "sequence", lambda preset: tuple(reversed(real(preset))))


# ---- ichord's real Finalizing: nothing observed on hardware happens ---------------------------------------

@pytest.mark.parametrize("cni", ["flannel", "cilium"])
async def test_ichord_restarts_leave_no_client_failing_and_dns_up(bundle: SecretsBundle, cni: str) -> None:
    async with rotated(bundle, cni, timing=SETTLE_SCALED, kubelet_lag=KUBELET_LAG) as out:
        assert out.reason == "Rotated"
        # (a) every client holds the new CA; DNS answers and resolves new Services
        assert out.failing() == set() and out.env.clients.dns_ok() and out.env.clients.resolves_new_services()
        assert out.tainted() == []
        restarted = [e["workload"] for e in out.events("client_restart")]
        cni_first = ["daemonsets/cilium", "deployments/cilium-operator"] if cni == "cilium" \
            else ["daemonsets/kube-flannel"]
        assert restarted == [*cni_first, "daemonsets/kube-proxy", "deployments/coredns"]
        # (b) one at a time: no DNS outage begins once the restarts began, and every outage has ended
        assert out.outages_during_restarts() == []
        assert all(o["end"] is not None for o in out.env.clients.dns_outages)
        # flannel keeps DNS answering throughout; cilium's agents failing x509 since Issuing took it down until
        # the CNI restart (the structural window reported with this test)
        assert out.first_restart["dns_ok"] is (cni == "flannel")
        # (d) the settle delay: no kubelet pending or down at any restart, none restarted after the first
        assert all(not e["kubelet_restart_pending"] and not e["nodes_not_ready"] for e in out.events("client_restart"))
        assert out.kubelet_restarts_after_first_client_restart() == []
        assert out.events("kubelet_restart_scheduled"), "the stale-Ready lag was not exercised"
        assert any(settling(s) for s in out.driver.snapshots)


# ---- (a) reproduced: no client restarts ----------------------------------------------------------------

@pytest.mark.parametrize("cni", ["flannel", "cilium"])
async def test_without_client_restarts_clients_keep_failing_x509(bundle: SecretsBundle, cni: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    no_restarts(monkeypatch)
    async with rotated(bundle, cni) as out:
        assert out.events("client_restart") == []
        failing = out.failing()
        assert "deployments/coredns" in failing and not out.env.clients.resolves_new_services()
        if cni == "flannel":
            assert "daemonsets/kube-flannel" in failing
        else:
            assert {"daemonsets/cilium", "deployments/cilium-operator"} <= failing
            assert out.tainted() == sorted(n.nodename for n in out.env.talos.nodes.values())
            assert not out.env.clients.dns_ok()
        assert all("unknown authority" in e["error"] for e in out.events("client_x509_failing"))


# ---- (b) reproduced: everything at once ------------------------------------------------------------------

async def test_restarting_all_clients_at_once_breaks_dns(bundle: SecretsBundle,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    all_at_once(monkeypatch)
    async with rotated(bundle, "flannel") as out:
        assert out.first_restart["dns_ok"]
        assert [e["workload"] for e in out.events("client_restart")] == [
            "daemonsets/kube-flannel", "daemonsets/kube-proxy", "deployments/coredns"]
        outages = out.outages_during_restarts()
        assert outages, "restarting the CNI, kube-proxy and CoreDNS together did not break DNS"
        assert out.env.clients.dns_ok()  # it comes back once the rollouts finish


# ---- (c) reproduced: cilium with CoreDNS first ---------------------------------------------------------

async def test_cilium_coredns_first_never_gets_coredns_back(bundle: SecretsBundle,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    coredns_first(monkeypatch)
    async with rotated(bundle, "cilium", timing=replace(TIMING, ca_client_restart_timeout=2.0)) as out:
        assert out.reason == "RotatedClientsNotBack"
        assert [e["workload"] for e in out.events("client_restart")] == ["deployments/coredns"]
        assert not out.env.workload_available("deployments", "coredns")
        assert out.tainted() and not out.env.clients.dns_ok()
        assert {"daemonsets/cilium", "deployments/cilium-operator"} <= out.failing()


# ---- (d) reproduced: stale Ready without the settle delay ------------------------------------------------

async def test_without_the_settle_delay_restarts_start_before_the_kubelets_restart(bundle: SecretsBundle) -> None:
    async with rotated(bundle, "flannel", timing=replace(TIMING, ca_kubelet_settle_delay=0.0),
                       kubelet_lag=KUBELET_LAG) as out:
        unsafe = [e for e in out.events("client_restart") if e["kubelet_restart_pending"] or e["nodes_not_ready"]]
        scheduled = out.events("kubelet_restart_scheduled")
        margin = out.first_restart["at"] - scheduled[-1]["at"]
        print(f"first client restart {margin:.3f} s after the last kubelet restart was scheduled")
        assert unsafe, f"every kubelet had restarted before the first client restart ({margin:.3f} s after the last " \
                       "CA change): raise KUBELET_LAG"
        # the kubelets restarted under the restarted clients: a Node went NotReady once the sequence had begun
        assert out.kubelet_restarts_after_first_client_restart()
