"""`ichord run` as a subprocess rotates the Talos API and Kubernetes CAs of a simulated 3+1 cluster.

The management API is separate from the managed cluster's (the trust pool that lets a self-hosted
daemon follow the serving-CA switch is a later issue). The test plays the operator for the hand-off.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.leases import get_lease
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint, export_fingerprint
from ichord.render.generate import render
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

CLIENTS = (("daemonsets", "kube-flannel"), ("daemonsets", "kube-proxy"), ("deployments", "coredns"))


def _workload(plural: str, name: str) -> dict[str, Any]:
    kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": {"labels": {"app": name}},
                                         "spec": {"containers": [{"name": name, "image": f"{name}:1"}]}}}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "kube-system"},
            "spec": spec}


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    e = await make_sim_env(management_api="separate")
    for plural, name in CLIENTS:
        e.kube.store.create(e.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
    return e


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(env.kubeconfig)
    yield client
    await client.close()


def _live_bundle(env: SimEnvironment) -> tuple[SecretsBundle, set[str]]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    data = {k: base64.b64decode(v) for k, v in obj["data"].items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)


async def _is(value: Any, want: str) -> bool:
    return bool(await value == want)


async def _follow(kube: KubeClient, env: SimEnvironment, seen: list[str], *,
                  stop: Any = None) -> dict[str, Any]:
    """Poll the operation, note each stage, and play the operator in AwaitingCredentials; return it once
    it is Completed or Failed (or when ``stop()`` is true)."""
    while True:
        op = await crds.operations(kube).get(env.namespace, "rotate")
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage")
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
        if stage == "AwaitingCredentials":
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await crds.operations(kube).patch(env.namespace, "rotate", {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if status.get("phase") in ("Completed", "Failed") or (stop is not None and stop()):
            return op
        await anyio.sleep(0.02)


async def test_the_daemon_rotates_the_default_cas_end_to_end(env: SimEnvironment, kube: KubeClient,
                                                             tmp_path: Path) -> None:
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})

        with anyio.fail_after(120):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        cond = find(op["status"]["conditions"], names.CA_ROTATION)
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Rotated"), cond
        # The stages were seen in order (a fast one may fall between two polls, never out of order).
        order = ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing", "Done"]
        assert [s for s in order if s in seen] == seen and seen[-1] == "Done" and "AwaitingCredentials" in seen

        # The bundle holds the new CAs, rotation.yaml is gone, the cluster ID/secret are unchanged.
        new, keys = _live_bundle(env)
        assert keys == {names.SECRETS_KEY}
        assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
        assert (new.cluster_id, new.cluster_secret) == (old.cluster_id, old.cluster_secret)
        # One apply per machine per pass, and no drift after: the machine reconciler converges with no apply.
        for m in env.machine_names:
            assert len(env.applies(m)) == 3, (m, env.applies(m))
        await eventually(lambda: all_ready(kube, env), within=30, what="machines Converged after the rotation")
        for m in env.machine_names:
            assert env.applies(m)[-1][0] == render(new, env.cluster_inputs(), env.machine_inputs(m)).hash()
            assert len(env.applies(m)) == 3

        # BundleBackupStale raised, the lock released, the finalizer gone, every client restarted once.
        cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        stale = find(cluster["status"]["conditions"], names.BUNDLE_BACKUP_STALE)
        assert stale is not None and (stale["status"], stale["reason"]) == ("True", "CARotated")
        lease = await get_lease(kube, env.namespace, f"{names.CLUSTER_LOCK_PREFIX}{env.cluster_name}")
        assert lease is None or lease.holder is None
        final = await crds.operations(kube).get(env.namespace, "rotate")
        assert names.CA_ROTATION_FINALIZER not in (final["metadata"].get("finalizers") or [])
        for plural, name in CLIENTS:
            obj = env.kube.store.get(env.kube.store.resolve("apps", "v1", plural), "kube-system", name)
            ann = obj["spec"]["template"]["metadata"]["annotations"]
            assert ann[names.CA_ROTATION_TEMPLATE_ANNOTATION] == op["metadata"]["uid"]
        # An export of the pre-rotation bundle keeps BundleBackupStale up; an export of the live one lowers it.
        async def stale_status() -> str:
            obj = await crds.clusters(kube).get(env.namespace, env.cluster_name)
            cond = find(obj["status"]["conditions"], names.BUNDLE_BACKUP_STALE)
            return str(cond["status"]) if cond else ""

        async def export(bundle: SecretsBundle) -> None:
            await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"metadata": {"annotations": {
                names.BUNDLE_EXPORTED_ANNOTATION: export_fingerprint(bundle)}}})

        await export(old)
        await anyio.sleep(1.0)  # the daemon's expiry pass runs on the cluster change
        assert await stale_status() == "True"
        await export(new)
        await eventually(lambda: _is(stale_status(), "False"), within=20, what="BundleBackupStale lowered")
        # Nothing secret in the daemon's log.
        log = daemon.log()
        for secret in (new.os.key_pem, new.k8s.key_pem, old.os.key_pem, old.k8s.key_pem):
            assert secret is not None
            assert secret.decode().splitlines()[1] not in log
    finally:
        assert await daemon.stop() == 0


async def test_killed_at_every_boundary_the_daemon_resumes_with_no_apply_repeated(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    """Killed (exit 137) after two applies of each pass and after the Secret replace, restarted each time."""
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
    seen: list[str] = []
    kills = ["ca-rotation.apply.after.accepting:2", "ca-rotation.apply.after.issuing:2",
             "ca-rotation.apply.after.dropping:2", "ca-rotation.replace.after"]
    for i, point in enumerate(kills):
        daemon = Daemon(env, tmp_path, f"replica-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        with anyio.fail_after(90):
            await _follow(kube, env, seen, stop=lambda d=daemon: d.proc.poll() is not None)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
        assert f"failpoint {point.split(':')[0]} reached" in daemon.log()
    # The Secret was replaced and the process died before status learned it.
    _, keys = _live_bundle(env)
    assert keys == {names.SECRETS_KEY}
    assert seen[-1] == "Dropping"
    daemon = Daemon(env, tmp_path, "replica-last")
    try:
        with anyio.fail_after(90):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", op["status"]
        for m in env.machine_names:
            assert len(env.applies(m)) == 3, (m, env.applies(m))
        order = ["Accepting", "AwaitingCredentials", "Issuing", "Dropping", "Finalizing", "Done"]
        assert [s for s in order if s in seen] == seen and seen[-1] == "Done"
    finally:
        assert await daemon.stop() == 0
