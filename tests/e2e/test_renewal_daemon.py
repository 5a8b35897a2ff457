"""`ichord run` as a subprocess plans a CA rotation from expiry (docs/decisions.md#renewal-policy), killed at the
failpoint between the create and the RotationDue write, then restarted and replaced: one TalosOperation, one
RotationPlanned Event, the condition naming it, whatever the daemon went through; the condition's commands, pasted
as printed, show the plan and start it."""

from __future__ import annotations

import datetime as dt
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
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_hints_pasted import Operator, commands_in

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
async def env(make_sim_env: MakeSimEnv, e2e_bundle: SecretsBundle) -> SimEnvironment:
    made = dt.datetime.now(dt.UTC) - CA_VALIDITY + dt.timedelta(days=20)  # etcd expires in 20 days
    return await make_sim_env(management_api="separate",
                              bundle=e2e_bundle.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD, now=made)}))


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    async with await from_kubeconfig(env.kubeconfig) as client:
        yield client


async def _operations(kube: KubeClient, env: SimEnvironment) -> list[dict[str, Any]]:
    objs, _ = await crds.operations(kube).list_objects(env.namespace)
    return objs


async def _due(kube: KubeClient, env: SimEnvironment) -> dict[str, Any] | None:
    cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
    return find((cluster.get("status") or {}).get("conditions"), names.ROTATION_DUE)


async def _planned_events(kube: KubeClient, env: SimEnvironment) -> list[dict[str, Any]]:
    out = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events")
    return [e for e in out.get("items") or [] if e.get("reason") == names.EventReason.ROTATION_PLANNED]


async def test_killed_after_the_create_restarted_and_replaced_there_is_one_operation(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    first = Daemon(env, tmp_path, "replica-0", extra_env={"ICHORD_FAILPOINTS": "renewal.created"})
    try:
        await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"caRotation": {
            "renewBeforeByTarget": {"etcd": "30d"}}}})
        await eventually(lambda: first.proc.poll() is not None, within=60, what="the daemon killed at the failpoint")
    finally:
        code = await first.stop()
    assert code == 137 and "failpoint renewal.created reached" in first.log(), first.log()[-3000:]
    (op,) = await _operations(kube, env)
    assert op["spec"]["paused"] is True and op["spec"]["caRotation"]["targets"] == ["etcd"]
    assert await _due(kube, env) is None  # killed before the condition write
    name = op["metadata"]["name"]

    second = Daemon(env, tmp_path, "replica-1")
    try:
        cond = await eventually(lambda: _due(kube, env), within=60, what="RotationDue written after the restart")
        assert cond["reason"] == names.RotationDueReason.AWAITING_APPROVAL and name in cond["message"]
        await eventually(lambda: _planned_events(kube, env), within=30, what="the RotationPlanned Event")
    finally:
        assert await second.stop() == 0

    # Another replica leads next: it steps the cluster (its lock-free expiry and renewal phases) and plans nothing.
    third = Daemon(env, tmp_path, "replica-2")
    try:
        async def leading() -> bool:
            lease = await get_lease(kube, env.namespace, names.LEADER_LEASE)
            return lease is not None and lease.holder == "replica-2"

        await eventually(leading, within=60, what="replica-2 leading")
        await eventually(lambda: '"phase": "renewal"' in third.log(), within=30,
                         what="replica-2 stepped the cluster")
        await anyio.sleep(1.0)
        assert [o["metadata"]["name"] for o in await _operations(kube, env)] == [name]
        assert len(await _planned_events(kube, env)) == 1
        assert (await _due(kube, env)) == cond

        # The operator pastes the condition's commands as printed: the plan, then the start.
        operator = Operator(env, tmp_path / "home")
        operator.home.mkdir()
        pasted = commands_in(cond["message"])
        assert [c.split()[3] for c in pasted] == ["get", "patch"], pasted
        for command in pasted:
            await operator.paste(command)
        assert "kind: TalosOperation" in operator.ran[pasted[0]].stdout

        async def under_way() -> bool:
            now = await _due(kube, env)
            return now is not None and now["reason"] == names.RotationDueReason.ROTATION_UNDER_WAY

        await eventually(under_way, within=30, what="RotationDue RotationUnderWay after the pasted start")
        (started,) = await _operations(kube, env)
        assert started["spec"]["paused"] is False
    finally:
        assert await third.stop() == 0
    assert len(await _planned_events(kube, env)) == 1
