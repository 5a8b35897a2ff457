"""`ichord run` as a subprocess rotates the aggregator CA (alone and with the Talos and Kubernetes CAs), and
abandons or holds a deleted rotation (docs/decisions.md#aggregator-ca and 3).

Asserted from the simulators' history and state, not from ichord's word: no two kube-apiservers were ever
restarting at once; when the operation reported Completed every control plane's kube-apiserver ran (and was
ready) on the new CAs; extension-apiserver-authentication ends with the new front-proxy CA alone.
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
from ichord.kube.errors import NotFound
from ichord.kube.leases import get_lease
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.behaviours import EXT_AUTH
from tests.e2e._daemon import Daemon, all_ready, eventually, machine_ready
from tests.e2e.conftest import MakeSimEnv
from tests.integration._apiserver_history import overlapping_restarts

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    return await make_sim_env(management_api="separate")


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(env.kubeconfig)
    yield client
    await client.close()


def _secret(env: SimEnvironment) -> dict[str, bytes]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    return {k: base64.b64decode(v) for k, v in obj["data"].items()}


def _ext_auth(env: SimEnvironment) -> list[bytes]:
    store = env.kube.store
    cm = store.get(store.resolve("", "v1", "configmaps"), *EXT_AUTH)
    return _pem.pem_blocks(cm["data"][names.EXTENSION_AUTH_CA_KEY].encode())


def _control_planes(env: SimEnvironment) -> list[str]:
    return [n for n in env.machine_names if env.node(n).is_control_plane]


def _apiservers_on(env: SimEnvironment, bundle: SecretsBundle) -> list[str]:
    """Control planes whose running, ready kube-apiserver did not load the bundle's aggregator/Kubernetes CAs."""
    wrong = []
    for name in _control_planes(env):
        loaded = env.follower.apiservers.get(name)
        node = env.node(name)
        if (loaded is None or not node.apiserver_ready or loaded.aggregator is None
                or loaded.aggregator.signer_pem != bundle.k8s_aggregator.cert_pem
                or loaded.issuing is None or loaded.issuing.signer_pem != bundle.k8s.cert_pem):
            wrong.append(name)
    return wrong


async def _follow(kube: KubeClient, env: SimEnvironment, seen: list[str], name: str = "rotate", *,
                  acknowledge: bool = True, stop: Any = None) -> dict[str, Any]:
    while True:
        op = await crds.operations(kube).get(env.namespace, name)
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage")
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
        if stage == "AwaitingCredentials" and acknowledge:
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await crds.operations(kube).patch(env.namespace, name, {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if status.get("phase") in ("Completed", "Failed") or (stop is not None and stop(op)):
            return op
        await anyio.sleep(0.02)


@pytest.mark.parametrize("targets", [["kubernetes-aggregator"], ["talos", "kubernetes", "kubernetes-aggregator"]])
async def test_the_daemon_rotates_the_aggregator_ca_one_kube_apiserver_at_a_time(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path, targets: list[str]) -> None:
    old = env.bundle
    assert old is not None and _ext_auth(env) == _pem.pem_blocks(old.k8s_aggregator.cert_pem)
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": targets}}})
        with anyio.fail_after(90):
            op = await _follow(kube, env, seen)
        new = SecretsBundle.from_yaml(_secret(env)[names.SECRETS_KEY])
        # At the moment Completed was seen, every control plane's kube-apiserver ran and was ready on the new CAs.
        assert _apiservers_on(env, new) == [], daemon.log()[-3000:]
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert _ext_auth(env) == _pem.pem_blocks(new.k8s_aggregator.cert_pem)  # the new CA alone
        assert new.k8s_aggregator.cert_pem != old.k8s_aggregator.cert_pem
        assert overlapping_restarts(env.talos.history.events) == []
        restarts = [e for e in env.talos.history.events if e["kind"] == "apiserver_restart"]
        assert len(restarts) >= 3 * len(_control_planes(env))
        assert ("AwaitingCredentials" in seen) is ("talos" in targets)
        assert "metrics-server" in op["status"]["message"]
        assert set(_secret(env)) == {names.SECRETS_KEY}
    finally:
        assert await daemon.stop() == 0


async def test_a_paused_rotation_deleted_in_accepting_is_abandoned_and_its_leftovers_only_reported(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    old = env.bundle
    assert old is not None
    worker = next(n for n in env.machine_names if not env.node(n).is_control_plane)
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "abandon"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
        # Paused in Accepting once every machine took the stage (so the nodes carry the new CAs).
        with anyio.fail_after(60):
            await _follow(kube, env, seen, "abandon", acknowledge=False,
                          stop=lambda _op: len(env.applies(worker)) >= 1)
        await crds.operations(kube).patch(env.namespace, "abandon", {"spec": {"paused": True}})
        with anyio.fail_after(30):
            held = await _follow(kube, env, seen, "abandon", acknowledge=False,
                                 stop=lambda op: (op.get("status") or {}).get("phase") == "Paused")
        assert held["status"]["caRotation"]["stage"] in ("Accepting", "AwaitingCredentials")
        assert names.ROTATION_KEY in _secret(env)
        await crds.operations(kube).delete(env.namespace, "abandon")

        async def gone() -> bool:
            try:
                await crds.operations(kube).get(env.namespace, "abandon")
            except NotFound:
                return True
            return False

        await eventually(gone, within=15, what="the abandoned rotation gone")
        assert names.ROTATION_KEY not in _secret(env)
        lease = await get_lease(kube, env.namespace, f"{names.CLUSTER_LOCK_PREFIX}{env.cluster_name}")
        assert lease is None or lease.holder is None
        store = env.kube.store
        assert not [n for n in store.list(store.resolve("", "v1", "nodes"), None)[0]
                    if (n.get("spec") or {}).get("unschedulable")]

        async def reported() -> bool:
            for name in _control_planes(env):
                ready = await machine_ready(kube, env, name)
                if ready is None or ready.get("reason") != "APIServerRestartRequired":
                    return False
            return True

        applies = {n: len(env.applies(n)) for n in _control_planes(env)}
        await eventually(reported, within=30, what="the control planes report the leftover CAs")
        await anyio.sleep(1.0)  # a few resyncs: still reported, never applied
        assert await reported() and applies == {n: len(env.applies(n)) for n in _control_planes(env)}

        # A new rotation would now refuse to start (preflight: the control planes do not run what ichord renders)
        # until a config operation removed the leftovers: the operator's step after an abandon.
    finally:
        assert await daemon.stop() == 0


async def test_a_rotation_deleted_in_dropping_is_held_and_runs_on_to_done(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": ["talos"]}}})
        with anyio.fail_after(60):
            await _follow(kube, env, seen, stop=lambda op: (op.get("status") or {}).get("caRotation", {}).get(
                "stage") == "Dropping")
        await crds.operations(kube).delete(env.namespace, "rotate")
        with anyio.fail_after(30):
            op = await _follow(kube, env, seen, stop=lambda op: find((op.get("status") or {}).get("conditions"),
                                                                     names.DELETION_HELD) is not None)
        cond = find(op["status"]["conditions"], names.DELETION_HELD)
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "PastPointOfNoReturn")
        assert "Dropping" in cond["message"]
        await eventually(lambda: _gone(kube, env, "rotate"), within=60, what="the held rotation done and gone")
        assert set(_secret(env)) == {names.SECRETS_KEY}  # replaced, never abandoned half-way
        new = SecretsBundle.from_yaml(_secret(env)[names.SECRETS_KEY])
        assert env.bundle is not None and new.os.cert_pem != env.bundle.os.cert_pem
    finally:
        assert await daemon.stop() == 0


async def _gone(kube: KubeClient, env: SimEnvironment, name: str) -> bool:
    try:
        await crds.operations(kube).get(env.namespace, name)
    except NotFound:
        return True
    return False


async def test_killed_between_the_apiserver_record_and_the_apply_the_daemon_resumes_one_at_a_time(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    """Exit 137 after a control plane's kube-apiserver was recorded and before its apply, twice; restarted."""
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation",
        "caRotation": {"targets": ["kubernetes-aggregator"]}}})
    seen: list[str] = []
    for i, point in enumerate(["ca-rotation.apiserver.recorded:2", "ca-rotation.apiserver.recorded:3"]):
        daemon = Daemon(env, tmp_path, f"replica-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        with anyio.fail_after(60):
            await _follow(kube, env, seen, stop=lambda _op, d=daemon: d.proc.poll() is not None)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
    daemon = Daemon(env, tmp_path, "replica-last")
    try:
        with anyio.fail_after(90):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", op["status"]
        for m in env.machine_names:  # killed before the apply: never applied twice (a worker has no aggregator CA)
            assert len(env.applies(m)) == (3 if env.node(m).is_control_plane else 0), (m, env.applies(m))
        assert overlapping_restarts(env.talos.history.events) == []
        new = SecretsBundle.from_yaml(_secret(env)[names.SECRETS_KEY])
        assert _ext_auth(env) == _pem.pem_blocks(new.k8s_aggregator.cert_pem)
    finally:
        assert await daemon.stop() == 0
