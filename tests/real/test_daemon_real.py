"""The chart and the daemon on the real kube-apiserver as the management cluster.

The chart's manifests (``helm template``) are applied to the real server; the daemon (``ichord run``
as a subprocess) runs as the chart's ServiceAccount with a TokenRequest token, so the chart's RBAC
is what it gets. The managed cluster stays simulated (Talos nodes and its own API server, as in the
e2e tier); ichord's objects live on the real server.
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
from ichord.kube.errors import NotFound
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import E2E_TIME_SCALE
from tests.e2e.test_ca_rotation_daemon import CLIENTS, _follow, _workload
from tests.real import tools
from tests.real.conftest import run_kubectl
from tests.real.controlplane import ControlPlane

pytestmark = [pytest.mark.anyio]

CHART = Path(__file__).resolve().parents[2] / "helm" / "ichord"
NS = "ichord-system"
RELEASE_SA = "ichord"


def _render_chart(release: str, namespace: str) -> str:
    built = tools.tool("helm")
    helm = str(built) if built is not None else shutil.which("helm")
    if helm is None:
        pytest.skip(tools.missing("helm") or "helm is missing")
    return subprocess.run([helm, "template", release, str(CHART), "--namespace", namespace], capture_output=True,
                          text=True, check=True, timeout=60).stdout


def _install(control_plane: ControlPlane, rendered: str, namespace: str) -> None:
    control_plane.ensure("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": namespace}})
    run_kubectl(control_plane.admin_kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=rendered)


@pytest.fixture(scope="session")
def chart_kubeconfig(control_plane: ControlPlane, crds: list[str],
                     tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart applied to the real server; a kubeconfig for its ServiceAccount (a bound token)."""
    _install(control_plane, _render_chart("ichord", NS), NS)
    return control_plane.service_account_kubeconfig(NS, RELEASE_SA, tmp_path_factory.mktemp("sa") / "kubeconfig")


def test_the_chart_rbac_is_what_the_service_account_gets(chart_kubeconfig: Path) -> None:
    def can(*args: str) -> str:
        return run_kubectl(chart_kubeconfig, "auth", "can-i", *args, check=False).strip()

    assert can("patch", "talosmachines.ichor.maesh.dev", "--subresource=status", "-n", NS) == "yes"
    assert can("update", "secrets", "-n", NS) == "yes"
    assert can("create", "leases.coordination.k8s.io", "-n", NS) == "yes"
    assert can("delete", "talosclusters.ichor.maesh.dev", "-n", NS) == "no"
    assert can("get", "secrets", "-n", "default") == "no"
    # The token authenticates as the ServiceAccount, and the RBAC authorizer refuses what the chart does not grant.
    who = run_kubectl(chart_kubeconfig, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
    assert who == f"system:serviceaccount:{NS}:{RELEASE_SA}"
    refused = run_kubectl(chart_kubeconfig, "get", "secrets", "-n", "default", check=False)
    assert "Forbidden" in refused and f"system:serviceaccount:{NS}:{RELEASE_SA}" in refused


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[SimEnvironment]:
    """A simulated 3+1 cluster whose management API is unused: its objects are copied to the real server."""
    async with SimEnvironment(bundle=generate_bundle(), time_scale=E2E_TIME_SCALE, management_api="separate",
                              namespace=NS) as e:
        for plural, name in CLIENTS:
            e.kube.store.create(e.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
        yield e


@pytest.fixture
async def kube(control_plane: ControlPlane, chart_kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(control_plane.admin_kubeconfig)
    yield client
    await client.close()


async def _copy_objects(env: SimEnvironment, kube: KubeClient, ns: str = NS) -> None:
    store = env.management.store

    def bare(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {**obj, "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}}

    secret = store.get(store.resolve("", "v1", "secrets"), ns, env.secret_name)
    await kube.core().create_namespaced_secret(ns, bare(secret))
    version = crd_api.VERSION
    await crd_api.clusters(kube).create(ns, bare(store.get(store.resolve(crd_api.GROUP, version, "talosclusters"),
                                                           ns, env.cluster_name)))
    for name in env.machine_names:
        await crd_api.machines(kube).create(ns, bare(store.get(store.resolve(crd_api.GROUP, version,
                                                                             "talosmachines"), ns, name)))


async def _live_bundle(kube: KubeClient, env: SimEnvironment) -> tuple[SecretsBundle, set[str]]:
    obj = await kube.core().read_namespaced_secret(env.secret_name, NS)
    data = {k: base64.b64decode(v) for k, v in obj.data.items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)


async def test_the_daemon_converges_and_rotates_on_the_real_management_api(
        env: SimEnvironment, kube: KubeClient, chart_kubeconfig: Path, tmp_path: Path) -> None:
    await _copy_objects(env, kube)
    env.kubeconfig = chart_kubeconfig  # the daemon runs as the chart's ServiceAccount, on the real server
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "real-0")
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        assert all(env.applies(m) == [] for m in env.machine_names)  # the nodes already run ichord's render

        await crd_api.operations(kube).create(NS, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
        with anyio.fail_after(120):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        cond = find(op["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Rotated"), cond
        order = ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing", "Done"]
        assert [s for s in order if s in seen] == seen and seen[-1] == "Done"
        # The real server holds the new CAs in the bundle Secret; every node runs them.
        new, keys = await _live_bundle(kube, env)
        assert keys == {names.SECRETS_KEY}
        assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
        await eventually(lambda: all_ready(kube, env), within=30, what="machines Converged after the rotation")
        for m in env.machine_names:
            assert len(env.applies(m)) == 3, (m, env.applies(m))
        final = await crd_api.operations(kube).get(NS, "rotate")
        assert names.CA_ROTATION_FINALIZER not in (final["metadata"].get("finalizers") or [])
        # The daemon's events reached the real server (created under the chart's RBAC).
        events = await kube.core().list_namespaced_event(NS)
        assert any(e.involved_object.kind == "TalosOperation" for e in events.items)
        assert env.management.requests.entries == []  # the simulated management API stood by unused
        assert env.kube.requests.count()  # while the managed cluster's own (simulated) API was used
        log = daemon.log()
        for key in (new.os.key_pem, new.k8s.key_pem, old.os.key_pem, old.k8s.key_pem):
            assert key is not None and key.decode().splitlines()[1] not in log
    finally:
        code = await daemon.stop()
        assert code == 0, daemon.log()[-4000:]


# ---- least privilege, proven by taking a rule away ---------------------------------------------

MUTANT_NS = "ichord-mutant"
#: The rule taken away: status writes of TalosMachines (the ClusterRole's status-subresource rule keeps the
#: other two). Chosen because nothing else the daemon does needs it, so only the RBAC authorizer stops it.
REMOVED = "talosmachines/status"


def _without(rendered: str, resource: str) -> tuple[str, int]:
    """The chart's manifests with ``resource`` taken out of every ClusterRole rule; how many rules lost it."""
    docs = [d for d in yamlio.load_all(rendered) if isinstance(d, dict)]
    removed = 0
    for doc in docs:
        if doc.get("kind") != "ClusterRole":
            continue
        for rule in doc.get("rules") or []:
            if resource in (rule.get("resources") or []):
                rule["resources"] = [r for r in rule["resources"] if r != resource]
                removed += 1
    return "---\n".join(yamlio.dump(d) for d in docs), removed


@pytest.fixture
async def mutant_env(tmp_path: Path) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=generate_bundle(), time_scale=E2E_TIME_SCALE, management_api="separate",
                              namespace=MUTANT_NS) as e:
        yield e


async def test_the_chart_without_one_rule_stops_the_daemon_on_the_real_authorizer(
        mutant_env: SimEnvironment, kube: KubeClient, control_plane: ControlPlane, tmp_path: Path) -> None:
    """The other half of least privilege: the chart's rules are not only enough, each is needed. With
    talosmachines/status gone the daemon runs, leads and writes its TalosCluster's status, and every
    TalosMachine status patch is Forbidden by kube-apiserver's RBAC authorizer, so no machine converges."""
    rendered, removed = _without(_render_chart("mutant", MUTANT_NS), REMOVED)
    assert removed == 1, "the chart no longer grants talosmachines/status in one rule: update this test"
    _install(control_plane, rendered, MUTANT_NS)
    sa_kubeconfig = control_plane.service_account_kubeconfig(MUTANT_NS, "mutant-ichord", tmp_path / "sa.kubeconfig")
    assert run_kubectl(sa_kubeconfig, "auth", "can-i", "patch", "talosmachines.ichor.maesh.dev",
                       "--subresource=status", "-n", MUTANT_NS, check=False).strip() == "no"
    await _copy_objects(mutant_env, kube, MUTANT_NS)
    mutant_env.kubeconfig = sa_kubeconfig
    daemon = Daemon(mutant_env, tmp_path, "mutant-0")
    try:
        async def refused_and_running() -> bool:
            cluster = await crd_api.clusters(kube).get(MUTANT_NS, mutant_env.cluster_name)
            refused = "patch talosmachines/status.ichor.maesh.dev" in daemon.log()  # the 403, as ichord words it
            return bool((cluster.get("status") or {}).get("conditions")) and refused

        await eventually(refused_and_running, within=60, what="the daemon running and refused talosmachines/status")
        for name in mutant_env.machine_names:
            machine = await crd_api.machines(kube).get(MUTANT_NS, name)
            assert not (machine.get("status") or {}).get("conditions"), (name, machine.get("status"))

        # Not only a log line: the refused status write is one Warning on each machine, naming the grant.
        async def warned() -> list[Any]:
            items = (await kube.core().list_namespaced_event(MUTANT_NS)).items
            found = [e for e in items if e.reason == names.EventReason.FORBIDDEN
                     and e.involved_object.kind == names.TALOS_MACHINE]
            return found if {e.involved_object.name for e in found} == set(mutant_env.machine_names) else []

        events = await eventually(warned, within=30, what="a Forbidden Warning on every TalosMachine")
        for event in events:
            assert event.type == "Warning" and (event.count or 1) == 1, event
            assert "patch talosmachines/status.ichor.maesh.dev" in event.message and "rbac.create" in event.message
    finally:
        await daemon.stop()


# ---- guarded deletes and key custody on the real server (issue 26) -----------------------------------

GUARD_NS = "ichord-guard"


@pytest.fixture
async def guard_env(tmp_path: Path) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=generate_bundle(), time_scale=E2E_TIME_SCALE, management_api="separate",
                              namespace=GUARD_NS) as e:
        for plural, name in CLIENTS:
            e.kube.store.create(e.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
        yield e


async def test_deletes_under_a_rotation_are_held_and_a_lost_bundle_is_restored_on_the_real_server(
        guard_env: SimEnvironment, kube: KubeClient, control_plane: ControlPlane, tmp_path: Path) -> None:
    """kube-apiserver's own finalizer semantics, the daemon as the chart's ServiceAccount: a TalosCluster and the
    bundle Secret deleted in Issuing are held; the rotation asks for restore-bundle (the Secret is held, so it is
    recreated), completes on the same new CAs, then the cluster's delete completes and the custody copy is gone."""
    from ichord.operations.ca_rotation.custody import copy_name
    from ichord.operations.ca_rotation.plan import handoff_token
    from ichord.operations.ca_rotation.restore import restore_bundle

    env = guard_env
    _install(control_plane, _render_chart("guard", GUARD_NS), GUARD_NS)
    env.kubeconfig = control_plane.service_account_kubeconfig(GUARD_NS, "guard-ichord", tmp_path / "sa.kubeconfig")
    await _copy_objects(env, kube, GUARD_NS)
    daemon = Daemon(env, tmp_path, "guard-0")
    ops, clusters = crd_api.operations(kube), crd_api.clusters(kube)
    secret_path = f"/api/v1/namespaces/{GUARD_NS}/secrets/{env.secret_name}"
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await ops.create(GUARD_NS, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
        nexts: dict[str, str] = {}
        restored = ""
        with anyio.fail_after(180):
            while True:
                op = await ops.get(GUARD_NS, "rotate")
                status = op.get("status") or {}
                stage = (status.get("caRotation") or {}).get("stage")
                if stage == "AwaitingCredentials":
                    token = handoff_token(status["caRotation"]["certificates"])
                    if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                        await ops.patch(GUARD_NS, "rotate", {"metadata": {"annotations": {
                            names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
                if stage == "Issuing" and not nexts:
                    nexts = {c["name"]: c["next"] for c in status["caRotation"]["certificates"]}
                    await clusters.delete(GUARD_NS, env.cluster_name)
                    await kube.raw("DELETE", secret_path)
                    cluster = await clusters.get(GUARD_NS, env.cluster_name)
                    secret = await kube.raw("GET", secret_path)
                    assert cluster["metadata"].get("deletionTimestamp") and secret["metadata"].get("deletionTimestamp")
                    assert names.OPERATION_GUARD_FINALIZER in cluster["metadata"]["finalizers"]
                    assert names.BUNDLE_CUSTODY_FINALIZER in secret["metadata"]["finalizers"]
                cond = find(status.get("conditions"), names.CA_ROTATION) or {}
                if cond.get("reason") == "BundleRestoreRequired" and not restored:
                    assert f"ichord cluster restore-bundle {env.cluster_name} -n {GUARD_NS}" in cond["message"]
                    restored = (await restore_bundle(kube, GUARD_NS, env.cluster_name)).action
                if status.get("phase") in ("Completed", "Failed"):
                    break
                await anyio.sleep(0.05)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert restored == "recreated"
        new, keys = await _live_bundle_in(kube, env, GUARD_NS)
        assert keys == {names.SECRETS_KEY}
        assert {"talos": ca_fingerprint(new.os), "kubernetes": ca_fingerprint(new.k8s)} == nexts  # the same CAs

        async def let_go() -> bool:
            try:
                await clusters.get(GUARD_NS, env.cluster_name)
                return False
            except NotFound:  # the held delete completed
                pass
            secret = await kube.raw("GET", secret_path)
            copies = (await kube.raw("GET", f"/api/v1/namespaces/{GUARD_NS}/secrets"))["items"]
            return not secret["metadata"].get("finalizers") and not any(
                c["metadata"]["name"] == copy_name(op["metadata"]["uid"]) for c in copies)

        await eventually(let_go, within=60, what="the cluster deleted, the custody copy gone, the Secret let go")
    finally:
        code = await daemon.stop()
        assert code == 0, daemon.log()[-4000:]


async def _live_bundle_in(kube: KubeClient, env: SimEnvironment, ns: str) -> tuple[SecretsBundle, set[str]]:
    obj = await kube.core().read_namespaced_secret(env.secret_name, ns)
    data = {k: base64.b64decode(v) for k, v in obj.data.items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)
