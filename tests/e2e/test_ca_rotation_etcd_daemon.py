"""`ichord run` as a subprocess rotates the etcd CA of a simulated cluster: three passes, each followed by a
reboot of every control plane, one at a time (docs/decisions.md#etcd-reboot-roll).

Everything is asserted from the simulators: the Talos history (quorum never lost, members always
trusting each other, one round of control-plane reboots per pass, the worker never), the Nodes (none
left cordoned), each member's loaded CA at the end (signs with and trusts only the new etcd CA) and
the bundle Secret (holds it). The kill test stops the daemon between the marker and the Reboot call
and between the Reboot and the marker's clearing, and checks that no control plane rebooted twice.
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
from ichord.kube.errors import KubeError
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests._etcd_history import ca_fp, etcd_violations, final_trust
from tests.e2e._daemon import Daemon
from tests.e2e._signals import Signals
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_ca_rotation_aggregator_daemon import _apiservers_on, _ext_auth
from tests.integration._apiserver_history import overlapping_restarts

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

CLIENTS = (("daemonsets", "kube-flannel"), ("daemonsets", "kube-proxy"), ("deployments", "coredns"))


def _workload(plural: str, name: str) -> dict[str, Any]:
    kind = "DaemonSet" if plural == "daemonsets" else "Deployment"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": name, "image": f"{name}:1"}]}}}}


async def _env(make_sim_env: MakeSimEnv, control_planes: int) -> SimEnvironment:
    e = await make_sim_env(management_api="separate", control_planes=control_planes)
    for plural, name in CLIENTS:
        e.kube.store.create(e.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))
    return e


@pytest.fixture
async def kube_of() -> AsyncIterator[Any]:
    clients: list[KubeClient] = []

    async def make(env: SimEnvironment) -> KubeClient:
        clients.append(await from_kubeconfig(env.kubeconfig))
        return clients[-1]

    yield make
    for c in clients:
        await c.close()


def _live_bundle(env: SimEnvironment) -> tuple[SecretsBundle, set[str]]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    data = {k: base64.b64decode(v) for k, v in obj["data"].items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)


async def _follow(kube: KubeClient, env: SimEnvironment, seen: list[str], *, stop: Any = None) -> dict[str, Any]:
    """Poll the operation, note each stage and reason, play the operator's hand-off; return it when it ends."""
    while True:
        op = await crds.operations(kube).get(env.namespace, "rotate")
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage")
        cond = find(status.get("conditions"), names.CA_ROTATION)
        for mark in (stage, cond and f"reason:{cond['reason']}"):
            if mark and mark not in seen:
                seen.append(str(mark))
        if stage == "AwaitingCredentials":
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                await crds.operations(kube).patch(env.namespace, "rotate", {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if status.get("phase") in ("Completed", "Failed") or (stop is not None and stop()):
            return op
        await anyio.sleep(0.05)


async def _start(kube: KubeClient, env: SimEnvironment, targets: list[str]) -> None:
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": targets}}})


def _check_etcd_end_state(env: SimEnvironment, old: SecretsBundle) -> SecretsBundle:
    cps = [m for m in env.machine_names if "cp" in m]
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []
    assert not [e for e in env.talos.history.of("reboot") if e["node"] not in cps]  # workers never reboot
    new, keys = _live_bundle(env)
    assert keys == {names.SECRETS_KEY}
    assert ca_fingerprint(new.etcd) != ca_fingerprint(old.etcd)
    fp = ca_fp(new.etcd.cert_pem)
    assert final_trust(env.talos.etcd.state()) == {cp: (fp, [fp]) for cp in cps}
    store = env.kube.store
    assert not [n["metadata"]["name"] for n in store.list(store.resolve("", "v1", "nodes"), None)[0]
                if n["spec"].get("unschedulable")]
    return new


async def test_the_daemon_rotates_the_etcd_ca_of_three_control_planes(make_sim_env: MakeSimEnv, kube_of: Any,
                                                                      tmp_path: Path) -> None:
    env = await _env(make_sim_env, 3)
    kube = await kube_of(env)
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    signals = Signals(env)
    try:
        await _start(kube, env, ["etcd"])
        with anyio.fail_after(90):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert "AwaitingCredentials" not in seen and "reason:RebootingEtcd" in seen
        # Every reboot of the roll was ichord's own: no Warning, no Unreachable anywhere, each said as planned.
        # The one Warning is the person's task the rotation leaves: export the bundle backup again.
        signals.close()
        assert [e.reason for e in signals.warnings()] == [names.EventReason.BUNDLE_BACKUP_STALE], signals.warnings()
        assert signals.with_reason("Unreachable") == [], signals.with_reason("Unreachable")
        unreachable = [e for e in signals.machine_states if e[2] == "Unreachable"]
        assert unreachable == [], unreachable
        cps = {m for m in env.machine_names if "cp" in m}
        rebooting = {t.name for t in signals.with_reason("Rebooting") if t.condition == "Ready"}
        assert rebooting == cps, signals.transitions
        normal = {e.name for e in signals.events if e.type == "Normal" and e.reason == "MachineRebooting"}
        assert normal == cps, signals.events
        # Only what was rotated is named: no kube-root-ca.crt wait, no Kubernetes-CA client warning.
        said = [t.message for t in signals.transitions] + [e.message for e in signals.events]
        assert not [m for m in said if "kube-root-ca.crt" in m], said
        assert not [w for w in op["status"]["plan"].get("warnings") or [] if "Kubernetes CA" in w], op["status"]["plan"]
        # kubectl get talosoperations: STAGE is the rotation's stage at every write, STEP only where the stage has
        # steps (none at Done).
        rows = [r for r in signals.columns if r[0] == "rotate"]
        assert rows and all(stage == recorded for _, _, stage, _, recorded in rows), rows
        assert [r for r in rows if r[2] == "Done"] and all(not r[3] for r in rows if r[2] == "Done"), rows
        new = _check_etcd_end_state(env, old)
        assert ca_fingerprint(new.os) == ca_fingerprint(old.os) and ca_fingerprint(new.k8s) == ca_fingerprint(old.k8s)
        assert op["status"]["plan"]["machines"][0]["reboots"] is True
    finally:
        assert await daemon.stop() == 0


async def test_the_daemon_rotates_talos_kubernetes_and_etcd_of_five_control_planes(
        make_sim_env: MakeSimEnv, kube_of: Any, tmp_path: Path) -> None:
    env = await _env(make_sim_env, 5)
    kube = await kube_of(env)
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await _start(kube, env, ["talos", "kubernetes", "etcd"])
        with anyio.fail_after(150):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert "AwaitingCredentials" in seen
        new = _check_etcd_end_state(env, old)
        assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
    finally:
        assert await daemon.stop() == 0


async def test_the_daemon_rotates_all_four_cas_of_three_control_planes(make_sim_env: MakeSimEnv, kube_of: Any,
                                                                       tmp_path: Path) -> None:
    """docs/decisions.md#ca-rotation-passes end to end with every target: the etcd roll after each pass, kube-apiserver
    restarted one control plane at a time in every pass, the aggregator ConfigMap reset to the new CA alone."""
    env = await _env(make_sim_env, 3)
    kube = await kube_of(env)
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    signals = Signals(env)
    try:
        await _start(kube, env, ["talos", "kubernetes", "etcd", "kubernetes-aggregator"])
        with anyio.fail_after(180):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        signals.close()  # kubectl get: STAGE follows the rotation; AwaitingCredentials and Done have no STEP
        rows = [r for r in signals.columns if r[0] == "rotate"]
        assert rows and all(stage == recorded for _, _, stage, _, recorded in rows), rows
        held = [r for r in rows if r[2] in ("AwaitingCredentials", "Done")]
        assert {r[2] for r in held} == {"AwaitingCredentials", "Done"} and not [r for r in held if r[3]], held
        assert "AwaitingCredentials" in seen and "reason:RebootingEtcd" in seen
        new = _check_etcd_end_state(env, old)
        for kind in ("os", "k8s", "k8s_aggregator"):
            assert ca_fingerprint(getattr(new, kind)) != ca_fingerprint(getattr(old, kind)), kind
        assert _ext_auth(env) == _pem.pem_blocks(new.k8s_aggregator.cert_pem)  # the new front-proxy CA alone
        assert _apiservers_on(env, new) == []  # every kube-apiserver ran on the new CAs at the end
        assert overlapping_restarts(env.talos.history.events) == []
    finally:
        assert await daemon.stop() == 0


async def test_killed_around_the_reboot_call_the_daemon_resumes_with_no_double_reboot(
        make_sim_env: MakeSimEnv, kube_of: Any, tmp_path: Path) -> None:
    """Killed after the marker before the Reboot (first control plane), after the Reboot before the marker's clearing
    (second), and after a reboot was verified before it was recorded (third); restarted each time."""
    env = await _env(make_sim_env, 3)
    kube = await kube_of(env)
    old = env.bundle
    assert old is not None
    await _start(kube, env, ["etcd"])
    seen: list[str] = []
    for i, point in enumerate(["roll.marker.after:1", "roll.reboot.after:1", "roll.done.before:1"]):
        daemon = Daemon(env, tmp_path, f"replica-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        with anyio.fail_after(60):
            await _follow(kube, env, seen, stop=lambda d=daemon: d.proc.poll() is not None)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
        assert f"failpoint {point.split(':')[0]} reached" in daemon.log()
    daemon = Daemon(env, tmp_path, "replica-last")
    try:
        with anyio.fail_after(90):
            op = await _follow(kube, env, seen)
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        _check_etcd_end_state(env, old)
    finally:
        assert await daemon.stop() == 0


async def test_a_single_control_plane_rotates_its_etcd_ca_with_the_daemon_on_its_own_api(
        make_sim_env: MakeSimEnv, kube_of: Any, tmp_path: Path) -> None:
    """One control plane, ichord's objects on the cluster's own API: the API is gone during each of the three
    reboots and the daemon rides them out (its lease outlives a reboot, docs/decisions.md#rotation-state's single-node
    case)."""
    env = await make_sim_env(control_planes=1)
    kube = await kube_of(env)
    old = env.bundle
    assert old is not None
    daemon = Daemon(env, tmp_path, "replica-0")
    seen: list[str] = []
    try:
        await _start(kube, env, ["etcd"])

        async def follow() -> dict[str, Any]:
            while True:  # the API is away during each reboot: look again
                try:
                    return await _follow(kube, env, seen)
                except KubeError:  # connection refused while the only control plane reboots
                    await anyio.sleep(0.1)

        with anyio.fail_after(90):
            op = await follow()
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert op["status"]["plan"]["kubernetesAPIUnavailable"] is True
        _check_etcd_end_state(env, old)
        assert daemon.proc.poll() is None  # never exited on a refused connection
    finally:
        assert await daemon.stop() == 0
