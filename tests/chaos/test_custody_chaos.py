"""The chaos tier for guarded deletes and key custody (issue 26): ``ichord run`` rotating the default CAs while the
operator deletes the TalosCluster (held) at Accepting, force-deletes the bundle Secret (its finalizer taken off) at
Issuing and, when the rotation asks, runs the command its condition names (``ichord cluster restore-bundle``); the
daemon killed at every failpoint of the hold, the custody copy, the restore and the release, in turn.

Checked from the simulators: the rotation completes on the SAME new CAs the nodes were given before the Secret was
lost (status fingerprints recorded then, the bundle Secret and every node compared); the held cluster is deleted
after it and no TalosMachine keeps a guard finalizer; the custody copy is gone and the bundle Secret holds no
finalizer; and _chaos.common_invariants (no rotation.yaml, cordon or lock left, no key material in any log, status or
Event).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.cli import main
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound
from ichord.operations.ca_rotation.custody import copy_name
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests.chaos._chaos import common_invariants, kill_at_each_failpoint, on_new_talos_and_kubernetes_cas, operation
from tests.e2e._daemon import Daemon, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]

#: The failpoints this scenario passes, in order: the hold written before the rotation's own finalizer, the custody
#: copy written before rotation.yaml, the restored Secret noticed, the custody released at Done, the cluster let go.
FAILPOINTS = ["guard.hold.after", "ca-rotation.custody.kept", "ca-rotation.custody.restored",
              "ca-rotation.custody.released", "guard.release.before", "guard.release.after"]


class Operator:
    """Plays the operator through the API (the test's own identity): hand-off, the deletes, the restore."""

    def __init__(self, kube: KubeClient, env: SimEnvironment) -> None:
        self.kube, self.env = kube, env
        self.cluster_deleted = False
        self.secret_lost = False
        self.restores = 0
        self.nexts: dict[str, str] = {}

    async def step(self) -> dict[str, Any]:
        env, ns = self.env, self.env.namespace
        op = operation(env, "rotate")
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage")
        ops = crds.operations(self.kube)
        if stage == "AwaitingCredentials":
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await ops.patch(ns, "rotate", {"metadata": {"annotations": {
                    names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if stage and not self.cluster_deleted:
            await crds.clusters(self.kube).delete(ns, env.cluster_name)  # held by the running rotation
            self.cluster_deleted = True
        if stage == "Issuing" and not self.secret_lost:
            self.nexts = {c["name"]: c["next"] for c in status["caRotation"]["certificates"]}
            path = f"/api/v1/namespaces/{ns}/secrets/{env.secret_name}"
            await self.kube.raw("PATCH", path, body={"metadata": {"finalizers": None}},
                                content_type="application/merge-patch+json")
            await self.kube.raw("DELETE", path)  # forced: gone with the rotation's keys
            self.secret_lost = True
        cond = find(status.get("conditions"), names.CA_ROTATION) or {}
        if cond.get("reason") == "BundleRestoreRequired":
            command = f"ichord cluster restore-bundle {env.cluster_name} -n {ns}"
            assert command in cond["message"], cond
            argv = ["cluster", "restore-bundle", env.cluster_name, "-n", ns, "--kubeconfig", str(env.kubeconfig)]
            assert await anyio.to_thread.run_sync(main, argv) == 0
            self.restores += 1
            await anyio.sleep(0.2)  # the daemon's next step sees it
        return op

    async def until(self, done: Any) -> dict[str, Any]:
        while True:
            op = await self.step()
            if done(op):
                return op
            await anyio.sleep(0.02)


async def test_killed_at_every_hold_custody_restore_and_release_failpoint_the_rotation_completes_on_the_same_cas(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    old = env.bundle
    assert old is not None
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
    uid = operation(env, "rotate")["metadata"]["uid"]
    operator = Operator(kube, env)
    daemons = await kill_at_each_failpoint(
        env, tmp_path, FAILPOINTS, lambda d: operator.until(lambda _op: d.proc.poll() is not None))
    last = Daemon(env, tmp_path, "fp-last")
    daemons.append(last)
    try:
        with anyio.fail_after(120):
            op = await operator.until(lambda o: (o.get("status") or {}).get("phase") in ("Completed", "Failed"))
        assert op["status"]["phase"] == "Completed", op["status"]
        assert operator.secret_lost and operator.restores >= 1
        store = env.management.store
        secret = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
        new = SecretsBundle.from_yaml(base64.b64decode(secret["data"][names.SECRETS_KEY]))
        assert {"talos": ca_fingerprint(new.os), "kubernetes": ca_fingerprint(new.k8s)} == operator.nexts
        assert (new.cluster_id, new.cluster_secret) == (old.cluster_id, old.cluster_secret)
        on_new_talos_and_kubernetes_cas(env, new)  # the nodes' own view: the same new CAs

        async def let_go() -> bool:
            try:
                await crds.clusters(kube).get(env.namespace, env.cluster_name)
                return False
            except NotFound:
                pass
            machines, _ = await crds.machines(kube).list_objects(env.namespace)
            copies = [s for s in store.list(store.resolve("", "v1", "secrets"), env.namespace)[0]
                      if s["metadata"]["name"] == copy_name(uid)]
            bundle = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
            return (not copies and not bundle["metadata"].get("finalizers")
                    and not any(names.OPERATION_GUARD_FINALIZER in (m["metadata"].get("finalizers") or [])
                                for m in machines))

        await eventually(let_go, within=60, what="the cluster deleted, the machines, the copy and the Secret let go")
        # The last daemon has come up over what the killed ones left (and found nothing more to do).
        await eventually(lambda: last.port is not None, within=60, what="the last daemon serving")
        await common_invariants(env, "rotate", daemons, [old, new])
    finally:
        assert await last.stop() == 0
