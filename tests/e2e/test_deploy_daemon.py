"""The daemon as deployed: the chart's RBAC is exactly what it uses, and no key of a managed cluster
stays on disk.

`ichord run` runs as a subprocess under its own identity (the chart's service account) against a
separate management API, converges a 3+1 cluster and runs a CA rotation of the talos and kubernetes
CAs, which expire within the TalosCluster's spec.caRotation.renewBefore: the daemon creates that
TalosOperation itself (approval Automatic), the operator's part played by the test. The management
API records every request per identity; the chart's Role and ClusterRole (rendered with helm) must
allow each request the daemon made and grant nothing it did not use. While the daemon still runs,
every file under its temporary directory and every file descriptor it holds is checked for a PEM
private key: the rotation loaded admin kubeconfigs of the managed cluster many times.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.events import WARNING, EventRecorder, ObjectRef
from ichord.operations.gates import GateSpecError, policy_of, resolve_trust
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.faults import Access
from tests._helm import find_helm, render
from tests.e2e import _rbac
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_ca_rotation_aggregator_daemon import _follow
from tests.e2e.test_ca_rotation_daemon import CLIENTS, _workload

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.slow]

RELEASE = "ichord"  # the chart names the service account after the release: "ichord"


def key_material(pid: int, tmpdir: Path) -> list[str]:
    """Files under ``tmpdir`` and the process's open fds that hold a PEM private key (or are memfds)."""
    found = []
    for dirpath, _, names in os.walk(tmpdir):
        for name in names:
            path = Path(dirpath) / name
            if b"PRIVATE KEY" in path.read_bytes():
                found.append(str(path))
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("/memfd:"):
            found.append(f"fd {fd}: {target}")
        elif target.startswith("/") and os.path.isfile(target):
            try:
                if b"PRIVATE KEY" in Path(target).read_bytes():
                    found.append(f"fd {fd}: {target}")
            except OSError:
                continue
    return found


async def _planned(kube: KubeClient, env: SimEnvironment) -> dict[str, Any] | None:
    objs, _ = await crds.operations(kube).list_objects(env.namespace)
    return objs[0] if objs else None


async def test_the_chart_grants_exactly_what_the_daemon_uses_and_no_key_stays_on_disk(
        make_sim_env: MakeSimEnv, e2e_bundle: SecretsBundle, tmp_path: Path) -> None:
    made = dt.datetime.now(dt.UTC) - CA_VALIDITY + dt.timedelta(days=20)  # talos and kubernetes expire in 20 days
    expiring = e2e_bundle.with_cas({kind: generate_ca(kind, now=made) for kind in (CAKind.OS, CAKind.KUBERNETES)})
    env = await make_sim_env(management_api="separate", bundle=expiring)
    for plural, name in CLIENTS:
        env.kube.store.create(env.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
    user = f"system:serviceaccount:{env.namespace}:{RELEASE}"
    token = secrets.token_urlsafe(24)
    env.management.add_user(token, user)
    kubeconfig = env.management.write_kubeconfig(tmp_path / "daemon.kubeconfig", namespace=env.namespace,
                                                  token=token)
    daemon_tmp = tmp_path / "daemon-tmp"
    daemon_tmp.mkdir()
    daemon = Daemon(env, tmp_path, "replica-0", kubeconfig=kubeconfig, extra_env={"TMPDIR": str(daemon_tmp)})
    async with await from_kubeconfig(env.kubeconfig) as kube:
        try:
            await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
            # The renewal policy plans the rotation: the daemon's own create of the TalosOperation.
            await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"caRotation": {
                "renewBefore": "30d", "approval": "Automatic"}}})
            planned = await eventually(lambda: _planned(kube, env), within=60, what="the renewal policy's operation")
            assert planned["spec"]["caRotation"]["targets"] == ["talos", "kubernetes"]
            with anyio.fail_after(120):
                op = await _follow(kube, env, [], planned["metadata"]["name"])
            assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-3000:])
            await eventually(lambda: all_ready(kube, env), within=30, what="machines Converged after the rotation")
            # Every admin kubeconfig of the rotation was loaded by now; kubernetes-asyncio alone would have left
            # their keys in the temporary directory until exit.
            assert key_material(daemon.proc.pid, daemon_tmp) == []
            # The managed cluster saw the Talos-issued admin certificate (its x509 user, not the test's token).
            assert env.kube.requests.users() - {"ichord-sim"}, "the rotation never used an admin kubeconfig"
        finally:
            assert await daemon.stop() == 0
    # One path of the daemon's code the scenario does not reach: a repeated Event bumps its count by PATCH
    # (ichord.kube.events). Recorded the same way, with the daemon's identity and its recorder.
    async with await from_kubeconfig(kubeconfig) as as_daemon:
        recorder = EventRecorder(as_daemon, instance="rbac-test")
        cluster = await crds.clusters(as_daemon).get(env.namespace, env.cluster_name)
        for _ in range(2):
            assert await recorder.post(ObjectRef.of(cluster), WARNING, "RBACCheck", "the same message twice")
        # A health gate's caBundle in a ConfigMap (ichord/operations/gates.py), read by name when the gates are asked
        # (absent here: the read is refused with GateSpecError, and recorded).
        gate = {"name": "rbac", "prometheus": {"url": "https://prometheus.invalid", "query": "up",
                                               "caBundle": {"configMapKeyRef": {"name": "rbac-ca", "key": "ca.crt"}}}}
        with pytest.raises(GateSpecError, match="does not exist"):
            await resolve_trust(as_daemon, env.namespace, policy_of({"spec": {"health": {"gates": [gate]}}}, {}))
    recorded = env.management.requests.by_user(user)
    assert any(a.verb == "patch" and a.resource == "events" for a in recorded)
    assert env.management.requests.users() <= {user, "ichord-sim"}  # the test's own client is ichord-sim
    print("recorded:\n  " + "\n  ".join(_rbac.describe(recorded)))
    if find_helm() is None:
        pytest.skip("helm is not installed (PATH, $ICHORD_HELM or ~/.cache/ichord/tools/*/bin): the rotation left "
                    "no key on disk, but the chart's RBAC cannot be rendered to compare with the recording")

    for values in ([], ["--set", f"rbac.clusterLockNames={{{env.cluster_name}}}"]):
        docs = render(*values, namespace=env.namespace, release=RELEASE)
        granted = _rbac.chart_grants(docs, RELEASE, env.namespace)
        missing, unused = _rbac.compare(granted, recorded)
        assert not missing, f"the chart ({values}) does not allow: {_rbac.describe(missing)}"
        assert not unused, f"the chart ({values}) grants what the daemon never used: {sorted(map(str, unused))}"
    # Limited to the listed clusters' locks, another cluster's lock is refused.
    other = Access(user, "update", "coordination.k8s.io", "leases", "", env.namespace, "ichord-lock-other")
    assert _rbac.compare(granted, [other])[0] == {other}

    # The comparison fails both ways: an extra grant is reported unused, a missing one as a refused request.
    extra = _rbac.Grant("cluster", "", "configmaps", "delete", None)  # never used
    assert _rbac.compare(granted | {extra}, recorded)[1] == {extra}
    for needed in sorted(granted, key=str):
        refused, _ = _rbac.compare(granted - {needed}, recorded)
        assert refused and all(_rbac.allows(needed, a) for a in refused), needed
    assert _rbac.compare(granted, [*recorded, Access(user, "delete", "", "configmaps", "", env.namespace, "x")])[0]
