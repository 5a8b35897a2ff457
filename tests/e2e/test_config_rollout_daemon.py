"""`ichord run` as a subprocess rolls out a reboot-class patch and an API-server-restart patch
(docs/decisions.md#config-rollout).

3 control planes + 3 workers, a Deployment of 3 under a PodDisruptionBudget of minAvailable 2 on the
managed cluster, the daemon told it runs on worker 1's Node (NODE_NAME). Asserted from the simulators'
history: every node rebooted exactly once, never two control planes or two workers down together
(maxUnavailable 1), the PDB never violated at any pod change, the daemon's own node last, nothing left
cordoned, every TalosMachine Ready=True after. Then the same rollout with the daemon killed at the roll's
failpoints and restarted each time: still exactly one reboot per node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube.eviction import pod_ready
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e._signals import Signals
from tests.e2e.conftest import MakeSimEnv
from tests.integration._config_world import API_SERVER_PATCH, REBOOT_PATCH, most_down_at_once, reboots

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

APP = {"app": "web"}


@pytest.fixture
async def env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    e = await make_sim_env(management_api="separate", control_planes=3, workers=3, pod_start_delay=2.0)
    store = e.kube.store
    store.create(store.resolve("", "v1", "namespaces"), None, {"metadata": {"name": "app"}})
    store.create(store.resolve("apps", "v1", "deployments"), "app", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "app"},
        "spec": {"replicas": 3, "selector": {"matchLabels": APP}, "template": {
            "metadata": {"labels": APP}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}})
    store.create(store.resolve("policy", "v1", "poddisruptionbudgets"), "app", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web", "namespace": "app"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": APP}}})
    return e


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    client = await from_kubeconfig(env.kubeconfig)
    yield client
    await client.close()


class Healthy:
    """The app's Ready pods at every pod change of the managed cluster (the PDB's view)."""

    def __init__(self, env: SimEnvironment) -> None:
        self.env = env
        self.lowest: int | None = None
        env.kube.store.listeners.append(self._on_change)
        self._on_change(None, None)

    def count(self) -> int:
        store = self.env.kube.store
        pods = store.list(store.resolve("", "v1", "pods"), "app")[0]
        return sum(1 for p in pods if pod_ready(p))

    def _on_change(self, _change: Any, rt: Any) -> None:
        if rt is None or rt.plural == "pods":
            n = self.count()
            self.lowest = n if self.lowest is None else min(self.lowest, n)


_WARNED = {"rebootPaths": "RebootRequired", "apiServerRestartPaths": "APIServerRestartRequired"}


async def _prepare(env: SimEnvironment, kube: KubeClient, patch: str, field: str, count: int) -> None:
    """The patch reported by ``count`` machines, each with its one Warning already posted (a change that needs a
    person, before any operation): a test's Signals started after this hear only what the rollout says."""
    await eventually(lambda: env.workload_available("deployments", "web", "app"), within=30, what="the app Ready")
    await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
    before = Signals(env)
    try:
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [patch]}})

        async def reported() -> bool:
            objs, _ = await crds.machines(kube).list_objects(env.namespace)
            return sum(1 for o in objs if (o.get("status") or {}).get(field)) == count

        await eventually(reported, within=30, what=f"{count} machines reporting {field}")
        await eventually(lambda: len({e.name for e in before.warnings() if e.reason == _WARNED[field]}) == count,
                         within=30, what=f"{count} machines' {_WARNED[field]} Warning")
    finally:
        before.close()


async def _create(env: SimEnvironment, kube: KubeClient, name: str) -> None:
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "config", "maxUnavailable": 1}})


async def _finished(env: SimEnvironment, kube: KubeClient, name: str, stop: Any = None) -> dict[str, Any]:
    while True:
        op = await crds.operations(kube).get(env.namespace, name)
        if (op.get("status") or {}).get("phase") in ("Completed", "Failed") or (stop is not None and stop()):
            return op
        await anyio.sleep(0.05)


def _cordoned(env: SimEnvironment) -> list[str]:
    store = env.kube.store
    return [n["metadata"]["name"] for n in store.list(store.resolve("", "v1", "nodes"), None)[0]
            if (n.get("spec") or {}).get("unschedulable")
            or CORDONED_BY_ICHORD_ANNOTATION in (n["metadata"].get("annotations") or {})]


async def _converged_after(env: SimEnvironment, kube: KubeClient) -> None:
    await eventually(lambda: all_ready(kube, env, ("Converged", "Applied")), within=30,
                     what="every TalosMachine Ready=True after the rollout")


async def test_the_daemon_rolls_a_reboot_patch_out_one_node_at_a_time(env: SimEnvironment, kube: KubeClient,
                                                                     tmp_path: Path) -> None:
    own = f"{env.cluster_name}-worker-1"
    daemon = Daemon(env, tmp_path, "replica-0", extra_env={"NODE_NAME": env.node(own).nodename})
    try:
        await _prepare(env, kube, REBOOT_PATCH, "rebootPaths", 6)
        healthy = Healthy(env)
        since = len(env.talos.history.events)
        await _create(env, kube, "roll")
        with anyio.fail_after(90):
            op = await _finished(env, kube, "roll")
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        assert reboots(env, since) == {m: 1 for m in env.machine_names}
        assert most_down_at_once(env, f"{env.cluster_name}-cp-", since) == 1
        assert most_down_at_once(env, f"{env.cluster_name}-worker-", since) == 1
        assert healthy.lowest is not None and healthy.lowest >= 2, healthy.lowest
        done = op["status"]["roll"]["done"]
        assert done[:3] == sorted(m for m in env.machine_names if "-cp-" in m) and done[-1] == own
        assert _cordoned(env) == []
        await _converged_after(env, kube)
    finally:
        assert await daemon.stop() == 0


async def test_the_daemon_killed_at_the_roll_failpoints_reboots_each_node_once(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-prepare")
    try:
        await _prepare(env, kube, REBOOT_PATCH, "rebootPaths", 6)
    finally:
        assert await daemon.stop() == 0
    since = len(env.talos.history.events)
    signals = Signals(env)
    await _create(env, kube, "roll")
    kills = ["roll.cordon.after", "config.stage.after", "roll.marker.after", "roll.reboot.after:2",
             "roll.uncordon.before", "roll.done.before"]
    for i, point in enumerate(kills):
        daemon = Daemon(env, tmp_path, f"replica-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        with anyio.fail_after(60):
            await _finished(env, kube, "roll", stop=lambda d=daemon: d.proc.poll() is not None)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
    daemon = Daemon(env, tmp_path, "replica-last")
    try:
        with anyio.fail_after(90):
            op = await _finished(env, kube, "roll")
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-3000:])
        assert reboots(env, since) == {m: 1 for m in env.machine_names}
        # Killed after the STAGED apply (config.stage.after), before its marker: the restart does not stage it again.
        staged = {m: [e["mode"] for e in env.talos.history.since(since)
                      if e["kind"] == "apply" and e["node"] == env.node(m).name] for m in env.machine_names}
        assert staged == {m: ["STAGED"] for m in env.machine_names}, staged
        assert most_down_at_once(env, f"{env.cluster_name}-cp-", since) == 1
        assert _cordoned(env) == []
        await _converged_after(env, kube)
        # Killed between the marker and the Reboot, and after it: each new process read the marker, so the reboot
        # was still a planned one (nothing kept in memory).
        signals.close()
        unreachable = [e for e in signals.warnings() if e.reason == "MachineUnreachable"]
        assert unreachable == [] and signals.with_reason("Unreachable") == [], (unreachable, signals.transitions)
    finally:
        assert await daemon.stop() == 0


async def test_the_daemon_restarts_each_api_server_once_without_a_reboot(env: SimEnvironment, kube: KubeClient,
                                                                       tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await _prepare(env, kube, API_SERVER_PATCH, "apiServerRestartPaths", 3)
        since = len(env.talos.history.events)
        signals = Signals(env)
        await _create(env, kube, "restart")
        with anyio.fail_after(60):
            op = await _finished(env, kube, "restart")
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        signals.close()  # each restart was ichord's own: said as planned, no Warning
        assert signals.warnings() == [], signals.warnings()
        restarting = {e.name for e in signals.events if e.reason == "MachineAPIServerRestarting" and e.type == "Normal"}
        assert restarting == {m for m in env.machine_names if "-cp-" in m}, signals.events
        assert sum(reboots(env, since).values()) == 0
        kinds = [e["kind"] for e in env.talos.history.events[since:]
                 if e["kind"] in ("apiserver_restart", "apiserver_ready")]
        assert kinds == ["apiserver_restart", "apiserver_ready"] * 3  # one control plane at a time
        await _converged_after(env, kube)
    finally:
        assert await daemon.stop() == 0


async def test_the_daemon_killed_around_an_api_server_restart_restarts_each_once(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    daemon = Daemon(env, tmp_path, "replica-prepare")
    try:
        await _prepare(env, kube, API_SERVER_PATCH, "apiServerRestartPaths", 3)
    finally:
        assert await daemon.stop() == 0
    since = len(env.talos.history.events)
    await _create(env, kube, "restart")
    for i, point in enumerate(["config.apiserver.marker.after", "config.apiserver.apply.after:2"]):
        daemon = Daemon(env, tmp_path, f"replica-{i}", extra_env={"ICHORD_FAILPOINTS": point})
        with anyio.fail_after(60):
            await _finished(env, kube, "restart", stop=lambda d=daemon: d.proc.poll() is not None)
        assert await daemon.stop() == 137, (point, daemon.log()[-3000:])
    daemon = Daemon(env, tmp_path, "replica-last")
    try:
        with anyio.fail_after(60):
            op = await _finished(env, kube, "restart")
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-3000:])
        restarts = [e["node"] for e in env.talos.history.events[since:] if e["kind"] == "apiserver_restart"]
        assert sorted(restarts) == sorted(m for m in env.machine_names if "-cp-" in m)  # each once
        assert sum(reboots(env, since).values()) == 0
        await _converged_after(env, kube)
    finally:
        assert await daemon.stop() == 0


async def test_a_planned_rollout_raises_no_warning_and_no_unreachable(env: SimEnvironment, kube: KubeClient,
                                                                    tmp_path: Path) -> None:
    """Every reboot and API-server restart of the rollout was ichord's own: each shows as planned (Rebooting,
    a Normal Event), never as a lost node (Unreachable, a Warning MachineUnreachable)."""
    daemon = Daemon(env, tmp_path, "replica-0")
    try:
        await _prepare(env, kube, REBOOT_PATCH, "rebootPaths", 6)
        signals = Signals(env)  # from the operation's creation on: the RebootRequired report came before it
        since = len(env.talos.history.events)
        await _create(env, kube, "roll")
        with anyio.fail_after(90):
            op = await _finished(env, kube, "roll")
        assert op["status"]["phase"] == "Completed", (op["status"], daemon.log()[-4000:])
        await _converged_after(env, kube)
        signals.close()
        assert reboots(env, since) == {m: 1 for m in env.machine_names}
        assert signals.warnings() == [], signals.warnings()
        assert signals.with_reason("Unreachable") == [], signals.with_reason("Unreachable")
        # The planned loss was said: each machine's Ready went to Rebooting, with a Normal Event.
        rebooting = {t.name for t in signals.with_reason("Rebooting") if t.condition == "Ready"}
        assert rebooting == set(env.machine_names), signals.transitions
        normal = {e.name for e in signals.events if e.type == "Normal" and e.reason == "MachineRebooting"}
        assert normal == set(env.machine_names), signals.events
        # kubectl get talosoperations: STAGE shows the rollout's stage (Rolling, then Done) at every write.
        rows = [r for r in signals.columns if r[0] == "roll"]
        assert rows and all(stage == recorded for _, _, stage, _, recorded in rows), rows
        assert {r[2] for r in rows} >= {"Rolling", "Done"}, rows
    finally:
        assert await daemon.stop() == 0
