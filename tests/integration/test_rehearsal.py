"""``ichord cluster rehearse`` on a simulated "live" cluster (docs/architecture.md#rehearsal).

The live cluster is a SimEnvironment; the rehearsal reads it through its kubeconfig and its nodes' mutual TLS
like it reads a real one, and builds a twin of its own. Every request the live simulators served during a
rehearsal is counted: reads only (GET/LIST/WATCH, Version, COSI Get, EtcdMemberList, Kubeconfig). Then the same
operation runs for real on the live cluster and its reboots and kube-apiserver restarts are compared with the
rehearsal's, event by event; a refused operation exits 1 with the reason the real run gets.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord import yamlio
from ichord.api import names
from ichord.api.conditions import find
from ichord.contract import V1_13
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.operations.progress import DEFAULTS
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.rehearsal.model import Durations, clock
from ichord.rehearsal.play import rehearse
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import API_SERVER_PATCH, REBOOT_PATCH, World, world_on
from tests.integration._rehearsal import Writes, cli, logging_restored  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
TIMING = Timing().scaled(0.01)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


def _op(cluster: str, kind: str, **spec: Any) -> Obj:
    return {"apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION, "metadata": {"name": f"try-{kind}"},
            "spec": {"clusterRef": {"name": cluster}, "kind": kind, **spec}}


async def _rehearse(writes: Writes, op: Obj, *durations: str) -> Any:
    env = writes.env
    async with await from_kubeconfig(writes.kubeconfig, timing=TIMING) as kube:
        return await rehearse(kube, env.namespace, env.cluster_name, op, Durations.parse(list(durations)))


async def _run_for_real(world: World, op: Obj) -> tuple[Obj, list[tuple[str, str]]]:
    env = world.env
    since = len(env.talos.history.events)
    body = {**op, "metadata": {"name": "real"}}
    await crds.operations(world.kube).create(env.namespace, body)

    async def finished() -> bool:
        o = await world.op("real")
        return (o.get("status") or {}).get("phase") in (names.Phase.COMPLETED, names.Phase.FAILED)

    await world.run_until(finished, steps=4000, what="the real run finished")
    seen = [(e["kind"], e["node"]) for e in env.talos.history.events[since:]
            if e["kind"] in ("reboot", "apiserver_restart")]
    return await world.op("real"), seen


async def _every_machine_waits_for_a_reboot(world: World) -> None:
    """The reboot patch on the cluster, then every machine reporting the reboot it waits for."""
    await world.patch_cluster([REBOOT_PATCH])

    async def reported() -> bool:
        return sum(1 for m in await world.machines() if (m.get("status") or {}).get("rebootPaths")) == 6

    await world.run_until(reported, what="every machine reports the reboot it waits for")


async def _real_run_until_its_message_says(world: World, op: Obj, text: str) -> Obj:
    """The operation created for real (named ``real``), stepped until its status message says ``text``."""
    await crds.operations(world.kube).create(world.env.namespace, {**op, "metadata": {"name": "real"}})

    async def says() -> bool:
        return text in str(((await world.op("real")).get("status") or {}).get("message"))

    await world.run_until(says, steps=4000, what=f"the real run's message says {text!r}")
    return await world.op("real")


@pytest.fixture
async def live(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=3, workers=3,
                              pod_start_delay=2.0) as e:
        yield e


@pytest.fixture
async def world(live: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(live, TIMING):
        yield w


async def test_a_config_rollout_rehearsed_writes_nothing_and_matches_the_real_run(world: World, tmp_path: Path) -> None:
    live = world.env
    await world.deploy_app(replicas=2, min_available=1)
    await _every_machine_waits_for_a_reboot(world)
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"), "reboot=100-200")
    writes.assert_none()

    assert report.exit_code == 0, report.text()
    assert report.counted("reboot") == {m: 1 for m in live.machine_names}
    assert sum(report.counted("cordon").values()) >= 3  # the workers are drained (the app's PDB holds)
    data = report.as_data()
    assert data["durations"]["reboot"] == {"low": 100.0, "high": 200.0, "source": "given",
                                           "covers": data["durations"]["reboot"]["covers"]}
    assert data["durations"]["apply"]["source"] == "default"
    assert data["predictedDuration"]["low"] >= 6 * 100 and data["predictedDuration"]["high"] >= 6 * 200
    assert data["twin"]["podDisruptionBudgets"] == 1

    op, real = await _run_for_real(world, _op(live.cluster_name, "config"))
    assert op["status"]["phase"] == names.Phase.COMPLETED
    assert report.disruptions() == real


async def test_an_unsupported_target_stops_the_rehearsal_with_the_real_runs_reason(tmp_path: Path) -> None:
    async with SimEnvironment(bundle=generate_bundle(V1_13), contract=V1_13, time_scale=0.01, control_planes=1,
                              workers=1) as env:
        op = _op(env.cluster_name, "ca-rotation", caRotation={"targets": ["kubernetes-aggregator"]})
        writes = Writes(env, tmp_path)
        report = await _rehearse(writes, op)
        writes.assert_none()
        assert report.exit_code == 1
        (cond, reason, message), = report.recording.stops
        assert (cond, reason) == (names.CA_ROTATION, names.CARotationReason.UNSUPPORTED_TARGET)
        assert report.disruptions() == []
        async for world in world_on(env, TIMING):
            real, seen = await _run_for_real(world, op)
            got = find(real["status"].get("conditions"), names.CA_ROTATION) or {}
            assert (got.get("reason"), got.get("message")) == (reason, message)
            assert seen == []


async def test_an_invalid_patch_stops_the_rehearsal_with_the_real_runs_reason(world: World, tmp_path: Path) -> None:
    """A cluster patch Talos's decoder refuses: the rehearsal exits 1 on the condition, reason and message the real
    run ends on, and neither applies nor reboots anything."""
    live = world.env
    await world.patch_cluster(["machine:\n  env: just-a-string\n"])

    async def invalid() -> bool:
        return all((find((m.get("status") or {}).get("conditions"), names.READY) or {}).get("reason")
                   == names.ReadyReason.INVALID_CONFIG for m in await world.machines())

    await world.run_until(invalid, what="every machine Ready=False/InvalidConfig")
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"))
    writes.assert_none()
    assert report.exit_code == 1, report.text()
    (cond, reason, message), = report.recording.stops
    assert (cond, reason) == (names.CONFIG_ROLLOUT, names.ReadyReason.INVALID_CONFIG), report.text()
    assert "machine.env: expected a mapping" in message, message
    assert report.disruptions() == []

    real, seen = await _run_for_real(world, _op(live.cluster_name, "config"))
    got = find(real["status"].get("conditions"), cond) or {}
    assert (got.get("reason"), got.get("message")) == (reason, message), real["status"]
    assert seen == []
    print(f"\nrehearsal stop: {cond}/{reason}: {message}")


async def test_a_default_ca_rotation_is_rehearsed_with_its_hand_off(live: SimEnvironment, tmp_path: Path) -> None:
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "ca-rotation"))
    writes.assert_none()
    assert report.exit_code == 0, report.text()
    stages = [e.detail for e in report.recording.events if e.kind == "stage"]
    assert stages[-1] == "Done" and "AwaitingCredentials" in stages
    acts = [e.detail for e in report.recording.events if e.kind == "act"]
    assert any("ichord cluster credentials" in a for a in acts)
    assert set(report.counted("apiserver_restart")) == {m for m in live.machine_names if "-cp-" in m}
    low, high = report.total
    assert 0 < low < high
    assert f"predicted duration: {clock(low)} to {clock(high)}" in report.text()


@pytest.mark.usefixtures("logging_restored")
async def test_the_command_exit_codes_and_bad_input(tmp_path: Path) -> None:
    async with SimEnvironment(bundle=generate_bundle(V1_13), contract=V1_13, time_scale=0.01, control_planes=1,
                              workers=1) as env:
        writes = Writes(env, tmp_path)
        base = ["cluster", "rehearse", env.cluster_name, "-n", env.namespace, "--kubeconfig", str(writes.kubeconfig)]

        def op_file(name: str, doc: Any) -> str:
            path = tmp_path / name
            path.write_text(yamlio.dump(doc) if not isinstance(doc, str) else doc)
            return str(path)

        rotation = op_file("rotation.yaml", _op(env.cluster_name, "ca-rotation", caRotation={"targets": ["talos"]}))
        rc, out, err = await anyio.to_thread.run_sync(cli, [*base, "-f", rotation, "-o", "json"])
        assert rc == 0, (out, err)
        assert out.startswith("{"), out[:3000]
        data = json.loads(out)
        assert data["result"] == "completes" and data["stops"] == []
        assert [t["detail"] for t in data["timeline"] if t["event"] == "stage"][-1] == "Done"

        aggregator = op_file("agg.yaml", _op(env.cluster_name, "ca-rotation",
                                             caRotation={"targets": ["kubernetes-aggregator"]}))
        rc, out, err = await anyio.to_thread.run_sync(cli, [*base, "-f", aggregator])
        assert rc == 1, (out, err)
        assert "the real run would stop:" in out and f"{names.CARotationReason.UNSUPPORTED_TARGET}:" in out

        bad = {
            "not-an-operation": (op_file("cm.yaml", {"apiVersion": "v1", "kind": "ConfigMap"}), "must hold one"),
            "other-cluster": (op_file("other.yaml", _op("elsewhere", "config")), "not the cluster rehearsed"),
            "unknown-kind": (op_file("kind.yaml", _op(env.cluster_name, "defrag")), "not an operation kind"),
            "schema": (op_file("schema.yaml", _op(env.cluster_name, "config", maxUnavailable="lots")),
                       "not one the API server accepts"),
            "two-docs": (op_file("two.yaml", "a: 1\n---\nb: 2\n"), "holds 2 documents"),
            "name": (op_file("name.yaml", {**_op(env.cluster_name, "config"), "metadata": {"name": "Bad_Name"}}),
                     "metadata.name 'Bad_Name' is not a name the API server accepts"),
            "missing": (str(tmp_path / "nope.yaml"), "cannot read"),
        }
        for what, (path, says) in bad.items():
            rc, out, err = await anyio.to_thread.run_sync(cli, [*base, "-f", path])
            assert (rc, out) == (2, ""), (what, out, err)
            assert says in err, (what, err)
        # --rehearse on the commands that create an operation: the same rehearsal, nothing created.
        flags = [env.cluster_name, "-n", env.namespace, "--kubeconfig", str(writes.kubeconfig)]
        rc, out, err = await anyio.to_thread.run_sync(
            cli, ["cluster", "rotate", *flags, "--targets", "talos", "--rehearse", "-o", "json"])
        assert rc == 0 and json.loads(out)["operation"]["kind"] == "ca-rotation", (out, err)
        rc, out, err = await anyio.to_thread.run_sync(cli, ["cluster", "config-apply", *flags, "--rehearse"])
        assert rc == 1 and "NothingToDo:" in out, (out, err)  # nothing waits for a reboot: the daemon's refusal

        rc, out, err = await anyio.to_thread.run_sync(cli, [*base, "-f", rotation, "--duration", "reboot=soon"])
        assert rc == 2 and "--duration 'reboot=soon'" in err, err
        for budget in ("0", "nan", "inf"):  # argparse's float() takes nan and inf: refused before anything is read
            rc, out, err = await anyio.to_thread.run_sync(cli, [*base, "-f", rotation, "--budget", budget])
            assert (rc, out) == (2, "") and "--budget must be a positive number of seconds" in err, (budget, err)
        rc, out, err = await anyio.to_thread.run_sync(cli, ["cluster", "rehearse", "nosuch", "-n", env.namespace,
                                                             "--kubeconfig", str(writes.kubeconfig), "-f",
                                                             op_file("nosuch.yaml", _op("nosuch", "config"))])
        assert rc == 2 and "TalosCluster ichord-system/nosuch not found" in err, err
        writes.assert_none()


async def test_a_pdb_that_blocks_a_drain_is_predicted_and_then_seen(world: World, tmp_path: Path) -> None:
    live = world.env
    await world.deploy_app(replicas=1, min_available=1)
    await _every_machine_waits_for_a_reboot(world)
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"))
    writes.assert_none()
    assert report.exit_code == 1, report.text()
    (_cond, reason, message), = report.recording.stops
    assert "did not drain" in message and "a PodDisruptionBudget allows no disruption" in message
    assert [e.detail for e in report.recording.events if e.kind == "pdb"][:1] == [
        "PodDisruptionBudget app/web allows no disruption"]
    assert "drain blocked by" in report.text()

    real = await _real_run_until_its_message_says(world, _op(live.cluster_name, "config"), "did not drain")
    got = find(real["status"].get("conditions"), names.CONFIG_ROLLOUT) or {}
    assert got.get("reason") == reason
    pods = (await world.kube.raw("GET", "/api/v1/namespaces/app/pods"))["items"]
    assert any(f"app/{p['metadata']['name']}" in str(got.get("message")) for p in pods)


async def test_a_pod_no_controller_owns_is_predicted_to_stop_the_drain_and_then_seen(world: World,
                                                                                     tmp_path: Path) -> None:
    """A bare pod on a live worker is created on the same node of the twin (the simulator runs no controller that
    would own it): the rehearsal stops where the real run does, on the drain that refuses to lose it. A StatefulSet
    behind a PodDisruptionBudget is in the twin as a Deployment, so its evicted pod comes back and the budget lets
    the other drains through, as on the live cluster."""
    live = world.env
    kc = world.kube
    await kc.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": "scratch"}})
    worker = live.node(live.machine_names[-1]).nodename
    await kc.raw("POST", "/api/v1/namespaces/scratch/pods", body={
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "debug", "namespace": "scratch"},
        "spec": {"nodeName": worker, "containers": [{"name": "sh", "image": "busybox"}]}})
    labels = {"app": "db"}
    await kc.raw("POST", "/apis/apps/v1/namespaces/scratch/statefulsets", body={
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "scratch"},
        "spec": {"replicas": 2, "serviceName": "db", "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "db", "image": "pg"}]}}}})
    await kc.raw("POST", "/apis/policy/v1/namespaces/scratch/poddisruptionbudgets", body={
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db", "namespace": "scratch"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})
    await _every_machine_waits_for_a_reboot(world)
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"))
    writes.assert_none()
    assert report.exit_code == 1, report.text()
    (_cond, reason, message), = report.recording.stops
    assert "runs pods that no controller owns (scratch/debug)" in message, message
    assert f"Node {worker}" in message, message
    # Every machine before the worker with the bare pod was rebooted in the twin: the StatefulSet's budget held none.
    assert [n for _k, n in report.disruptions()] == live.machine_names[:-1], report.text()

    real = await _real_run_until_its_message_says(world, _op(live.cluster_name, "config"), "no controller owns")
    got = find(real["status"].get("conditions"), names.CONFIG_ROLLOUT) or {}
    assert (got.get("reason"), got.get("message")) == (reason, message)


async def test_an_api_server_restart_rollout_rehearsed_matches_the_real_run(world: World, tmp_path: Path) -> None:
    live = world.env
    await world.patch_cluster([API_SERVER_PATCH])

    async def reported() -> bool:
        ms = await world.machines()
        return sum(1 for m in ms if (m.get("status") or {}).get("apiServerRestartPaths")) == 3

    await world.run_until(reported, what="every control plane reports the restart it waits for")
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"))
    writes.assert_none()
    assert report.exit_code == 0, report.text()
    assert report.counted("reboot") == {}
    assert report.counted("apiserver_restart") == {m: 1 for m in live.machine_names if "-cp-" in m}
    op, real = await _run_for_real(world, _op(live.cluster_name, "config"))
    assert op["status"]["phase"] == names.Phase.COMPLETED
    assert report.disruptions() == real


async def test_an_etcd_rotation_rehearses_its_reboot_roll(live: SimEnvironment, tmp_path: Path) -> None:
    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "ca-rotation", caRotation={"targets": ["etcd"]}))
    writes.assert_none()
    assert report.exit_code == 0, report.text()
    control_planes = [m for m in live.machine_names if "-cp-" in m]
    reboots = [node for kind, node in report.disruptions() if kind == "reboot"]
    # Each of the three passes reboots every control plane once, one at a time (the plan's "three reboots per
    # control plane"); workers never.
    assert reboots == control_planes * 3
    assert not [e for e in report.recording.events if e.kind == "act"]  # etcd's CA hands nothing off


async def test_an_unfinished_operation_of_the_cluster_is_a_stop(tmp_path: Path) -> None:
    async with SimEnvironment(time_scale=0.01, control_planes=1, workers=1) as env:
        async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
            await crds.operations(kube).create(env.namespace, {**_op(env.cluster_name, "ca-rotation", paused=True),
                                                               "metadata": {"name": "waiting"}})
        writes = Writes(env, tmp_path)
        report = await _rehearse(writes, _op(env.cluster_name, "config"))
        writes.assert_none()
        assert report.exit_code == 1
        (_cond, reason, message), = report.recording.stops
        assert reason == "OperationUnfinished" and f"TalosOperation {env.namespace}/waiting (Pending)" in message


async def test_a_rehearsal_takes_its_durations_from_the_clusters_past_operations(world: World,
                                                                                 tmp_path: Path) -> None:
    """A past rollout's status.progress.observed (operations/progress.py) sets the reboot range (said so), each node
    its own (a slow node its slow reboot), and a kind without history stays the default (said so)."""
    live = world.env
    await _every_machine_waits_for_a_reboot(world)
    apply_mid = sum(DEFAULTS["apply"][:2]) / 2
    drain_mid = sum(DEFAULTS["drain"][:2]) / 2
    reboot = {m: 90.0 for m in live.machine_names}
    slow = live.machine_names[1]
    reboot[slow] = 300.0
    observed = [{"node": m, "step": "drain+apply+reboot" if "worker" in m else "apply+reboot",
                 "seconds": reboot[m] + apply_mid + (drain_mid if "worker" in m else 0.0)} for m in live.machine_names]
    past = {**_op(live.cluster_name, "config", paused=True), "metadata": {"name": "last-week"}}
    await crds.operations(world.kube).create(live.namespace, past)
    await crds.operations(world.kube).patch_status(live.namespace, "last-week", {"status": {
        "phase": names.Phase.COMPLETED, "progress": {"done": 6, "total": 6, "steps": "6/6", "observed": observed}}})

    writes = Writes(live, tmp_path)
    report = await _rehearse(writes, _op(live.cluster_name, "config"))
    writes.assert_none()
    assert report.exit_code == 0, report.text()
    data = report.as_data()
    assert data["durations"]["reboot"]["source"] == "history of 6 step(s)"
    assert (data["durations"]["reboot"]["low"], data["durations"]["reboot"]["high"]) == pytest.approx((90.0, 300.0))
    assert data["durations"]["drain"]["source"] == data["durations"]["apply"]["source"] == "default"
    assert "reboot 1m30s-5m00s (history of 6 step(s))" in report.text()
    # Each reboot costs its own node's recorded time: the slow node's 300 s, the others' 90 s.
    reboots = [t for t in report.timeline if t.event.kind == "reboot"]
    assert {t.event.node for t in reboots} == set(live.machine_names)
    for t in reboots:
        before = report.timeline[report.timeline.index(t) - 1].at
        assert t.at[0] - before[0] == pytest.approx(reboot[t.event.node]), t
