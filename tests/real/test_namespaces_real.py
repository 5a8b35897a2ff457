"""Issue 27, any namespace or a clear refusal: the chart installed in one namespace serves a TalosCluster in another
(watchNamespaces), on the real kube-apiserver, as the chart's ServiceAccount, with the flags the chart's Deployment
passes; with one grant taken out of the chart, the object it blocks says Forbidden (condition and one Warning).

The managed cluster stays simulated (Talos nodes and its own API server); ichord's objects and its RBAC are real.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord import yamlio
from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds as crd_api
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import E2E_TIME_SCALE
from tests.e2e.test_ca_rotation_daemon import CLIENTS, _follow, _workload
from tests.real import tools
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane
from tests.real.test_daemon_real import CHART, _copy_objects

pytestmark = [pytest.mark.anyio]


def _render(release: str, namespace: str, *sets: str) -> list[dict[str, Any]]:
    built = tools.tool("helm")
    helm = str(built) if built is not None else shutil.which("helm")
    if helm is None:
        pytest.skip(tools.missing("helm") or "helm is missing")
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [d for d in yamlio.load_all(out) if isinstance(d, dict)]


def _dump(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(yamlio.dump(d) for d in docs)


def _daemon_flags(docs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The namespace flags the chart's Deployment gives ``ichord run``: the daemon runs with what the chart says."""
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return tuple(a for a in args if a.startswith(("--watch-namespace=", "--allow-secret-namespace=")))


def _apply(control_plane: ControlPlane, docs: list[dict[str, Any]], release_namespace: str) -> None:
    """The chart's manifests applied as ``helm install`` would: each in its own namespace (kubectl apply -n refuses
    an object of another namespace, and the chart puts a Role in each served namespace)."""
    _ensure_namespace(control_plane, release_namespace)
    by_ns: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_ns.setdefault(doc["metadata"].get("namespace") or release_namespace, []).append(doc)
    for ns, group in sorted(by_ns.items(), key=lambda kv: kv[0] != release_namespace):
        run_kubectl(control_plane.admin_kubeconfig, "apply", "-n", ns, "-f", "-", stdin=_dump(group))


def _ensure_namespace(control_plane: ControlPlane, name: str) -> None:
    control_plane.ensure("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture
async def admin(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(control_plane.admin_kubeconfig)
    yield client
    await client.close()


async def _events(kube: KubeClient, namespace: str, kind: str, name: str, reason: str) -> list[Any]:
    items = (await kube.core().list_namespaced_event(namespace)).items
    return [e for e in items if e.reason == reason and (e.involved_object.kind, e.involved_object.name) == (kind, name)]


# ---- a cluster outside the release namespace converges and rotates --------------------------------------

SPREAD_NS, SPREAD_RELEASE, TEAM_A = "ichord-spread", "spread", "team-a"


@pytest.fixture
async def team_a(tmp_path: Path) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=generate_bundle(), time_scale=E2E_TIME_SCALE, management_api="separate",
                              namespace=TEAM_A) as e:
        for plural, name in CLIENTS:
            e.kube.store.create(e.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
        yield e


async def test_a_cluster_in_another_namespace_converges_and_rotates_as_the_charts_service_account(
        team_a: SimEnvironment, admin: KubeClient, control_plane: ControlPlane, tmp_path: Path) -> None:
    _ensure_namespace(control_plane, TEAM_A)  # the chart's Role for team-a goes there
    docs = _render(SPREAD_RELEASE, SPREAD_NS, f"watchNamespaces={{{TEAM_A}}}")
    flags = _daemon_flags(docs)
    assert flags == (f"--watch-namespace={TEAM_A}",)
    _apply(control_plane, docs, SPREAD_NS)
    sa = control_plane.service_account_kubeconfig(SPREAD_NS, f"{SPREAD_RELEASE}-ichord", tmp_path / "sa.kubeconfig")

    def can(*args: str) -> str:
        return run_kubectl(sa, "auth", "can-i", *args, check=False).strip()

    # Exactly the served namespaces: team-a's Secrets and Leases, not those of a namespace the chart does not list.
    assert can("get", "secrets", "-n", TEAM_A) == "yes" and can("create", "leases.coordination.k8s.io", "-n",
                                                                 TEAM_A) == "yes"
    assert can("get", "secrets", "-n", "default") == "no" and can("create", "leases.coordination.k8s.io", "-n",
                                                                   "default") == "no"

    await _copy_objects(team_a, admin, TEAM_A)  # the TalosCluster, its machines and its bundle Secret in team-a
    team_a.kubeconfig = sa
    old = team_a.bundle
    assert old is not None
    daemon = Daemon(team_a, tmp_path, "spread-0", controller_namespace=SPREAD_NS, extra_args=flags)
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(admin, team_a), within=90, what="every team-a machine converged")
        cluster = await crd_api.clusters(admin).get(TEAM_A, team_a.cluster_name)
        ready = find(cluster["status"]["conditions"], names.READY)
        assert ready is not None and ready["status"] == "True", cluster["status"]
        assert [c["name"] for c in cluster["status"]["certificates"]]  # expiry published: the bundle was read

        await crd_api.operations(admin).create(TEAM_A, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": team_a.cluster_name}, "kind": names.KIND_CA_ROTATION}})
        with anyio.fail_after(150):
            op = await _follow(admin, team_a, seen)
        assert op["status"]["phase"] == names.Phase.COMPLETED, (op["status"], daemon.log()[-4000:])
        cond = find(op["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Rotated"), cond
        assert seen[-1] == "Done", seen
        # The bundle Secret in team-a holds the new CAs; the lock Lease was taken and let go in team-a.
        secret = await admin.core().read_namespaced_secret(team_a.secret_name, TEAM_A)
        assert secret.metadata.labels.get(names.BUNDLE_LABEL) == "true"
        async def lock_let_go() -> bool:
            lease = await admin.coordination().read_namespaced_lease(
                f"{names.CLUSTER_LOCK_PREFIX}{team_a.cluster_name}", TEAM_A)
            return lease.spec.holder_identity is None

        await eventually(lock_let_go, within=30, what="the cluster lock in team-a let go after the rotation")
        new = SecretsBundle.from_yaml(base64.b64decode(secret.data[names.SECRETS_KEY]))
        assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
        # Nothing was refused on the way: no Forbidden Event, no 403 in the log.
        events = (await admin.core().list_namespaced_event(TEAM_A)).items
        assert not [e for e in events if e.reason == names.EventReason.FORBIDDEN]
        assert "is forbidden" not in daemon.log()
    finally:
        code = await daemon.stop()
        assert code == 0, daemon.log()[-4000:]


# ---- one grant taken away: the object it blocks says Forbidden --------------------------------------------

NARROW_NS, NARROW_RELEASE, TEAM_B = "ichord-narrow", "narrow", "team-b"


def _without_secrets_in(docs: list[dict[str, Any]], namespace: str) -> tuple[list[dict[str, Any]], int]:
    """The chart's manifests with the Secrets rule taken out of the Role of ``namespace``; how many rules went."""
    out, removed = [], 0
    for doc in docs:
        if doc["kind"] == "Role" and doc["metadata"]["namespace"] == namespace:
            rules = [r for r in doc["rules"] if "secrets" not in r.get("resources", [])]
            removed += len(doc["rules"]) - len(rules)
            out.append({**doc, "rules": rules})
        else:
            out.append(doc)
    return out, removed


@pytest.fixture
async def team_b(tmp_path: Path) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=generate_bundle(), time_scale=E2E_TIME_SCALE, management_api="separate",
                              namespace=TEAM_B, control_planes=1, workers=1) as e:
        yield e


async def test_a_grant_taken_away_is_a_forbidden_condition_and_one_warning_on_the_objects_it_blocks(
        team_b: SimEnvironment, admin: KubeClient, control_plane: ControlPlane, tmp_path: Path) -> None:
    _ensure_namespace(control_plane, TEAM_B)
    full = _render(NARROW_RELEASE, NARROW_NS, f"watchNamespaces={{{TEAM_B}}}")
    docs, removed = _without_secrets_in(full, TEAM_B)
    assert removed == 1, "the chart's team-b Role no longer grants Secrets in one rule: update this test"
    _apply(control_plane, docs, NARROW_NS)
    sa = control_plane.service_account_kubeconfig(NARROW_NS, f"{NARROW_RELEASE}-ichord", tmp_path / "sa.kubeconfig")
    assert run_kubectl(sa, "auth", "can-i", "get", "secrets", "-n", TEAM_B, check=False).strip() == "no"

    await _copy_objects(team_b, admin, TEAM_B)
    team_b.kubeconfig = sa
    daemon = Daemon(team_b, tmp_path, "narrow-0", controller_namespace=NARROW_NS, extra_args=_daemon_flags(full))
    name = team_b.cluster_name
    try:
        async def cluster_forbidden() -> dict[str, Any] | None:
            obj = await crd_api.clusters(admin).get(TEAM_B, name)
            ready = find((obj.get("status") or {}).get("conditions"), names.READY)
            return ready if ready is not None and ready["reason"] == "Forbidden" else None

        ready = await eventually(cluster_forbidden, within=60, what="the TalosCluster Ready=False/Forbidden")
        assert ready["status"] == "False"
        for part in (f"get secrets in namespace {TEAM_B}", f"system:serviceaccount:{NARROW_NS}:{NARROW_RELEASE}-ichord",
                     "403 Forbidden", f"add {TEAM_B} to the chart value watchNamespaces"):
            assert part in ready["message"], (part, ready["message"])
        for machine in team_b.machine_names:
            m_ready = find(((await crd_api.machines(admin).get(TEAM_B, machine)).get("status") or {}).get(
                "conditions"), names.READY)
            assert m_ready is not None and (m_ready["status"], m_ready["reason"]) == ("False", "Forbidden"), m_ready

        # An operation of the cluster is blocked by the same refusal, on its own condition.
        await crd_api.operations(admin).create(TEAM_B, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": name}, "kind": names.KIND_CA_ROTATION}})

        async def operation_forbidden() -> dict[str, Any] | None:
            obj = await crd_api.operations(admin).get(TEAM_B, "rotate")
            cond = find((obj.get("status") or {}).get("conditions"), names.CA_ROTATION)
            return obj if cond is not None and cond["reason"] == "Forbidden" else None

        op = await eventually(operation_forbidden, within=60, what="the TalosOperation CARotation=False/Forbidden")
        cond = find(op["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None and cond["status"] == "False" and "watchNamespaces" in cond["message"], cond
        assert op["status"]["phase"] == names.Phase.PAUSED

        # The cluster stepped many times meanwhile (the operation's steps are its steps): still one Warning each.
        for kind, obj_name in ((names.TALOS_CLUSTER, name), (names.TALOS_OPERATION, "rotate")):
            warnings = await _events(admin, TEAM_B, kind, obj_name, names.EventReason.FORBIDDEN)
            assert [(e.type, e.count or 1) for e in warnings] == [("Warning", 1)], (kind, warnings)
            assert "watchNamespaces" in warnings[0].message

        # The grant is given back: the same daemon reads the bundle, and the cluster is Ready.
        _apply(control_plane, full, NARROW_NS)

        async def cluster_ready() -> bool:
            obj = await crd_api.clusters(admin).get(TEAM_B, name)
            cond = find((obj.get("status") or {}).get("conditions"), names.READY)
            return cond is not None and cond["status"] == "True"

        await eventually(cluster_ready, within=60, what="the TalosCluster Ready once the grant is back")
    finally:
        await daemon.stop()
