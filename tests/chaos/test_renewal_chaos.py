"""Rotations planned from expiry under SIGKILL and failover (docs/decisions.md#renewal-policy): two `ichord run`
replicas at once, the leader SIGKILLed at a random moment once it leads, a new replica started each time (the
other one takes over), while the etcd CA is inside its renewal period.

Exactly one TalosOperation is ever created (counted from the management simulator's own request log: one create
answered 201, however many were sent), one RotationPlanned Event names it, and RotationDue names it, whatever the
kills interrupted (the create, the condition write, the Event).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import time
from pathlib import Path

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.leases import get_lease
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.sim.combined import SimEnvironment
from tests.e2e._daemon import Daemon, all_ready, eventually
from tests.e2e.conftest import MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.chaos]


@pytest.fixture
async def env(make_sim_env: MakeSimEnv, e2e_bundle: SecretsBundle) -> SimEnvironment:
    made = dt.datetime.now(dt.UTC) - CA_VALIDITY + dt.timedelta(days=20)  # etcd expires in 20 days
    return await make_sim_env(management_api="separate",
                              bundle=e2e_bundle.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD, now=made)}))


async def test_killed_and_failed_over_at_random_the_policy_creates_exactly_one_operation(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    seed = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    print(f"chaos seed {seed} (ICHORD_CHAOS_SEED={seed} repeats it)")
    replicas = [Daemon(env, tmp_path, "replica-0"), Daemon(env, tmp_path, "replica-1")]
    started = 2
    await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
    await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"caRotation": {
        "renewBeforeByTarget": {"etcd": "30d"}}}})
    killed = 0
    try:
        with anyio.fail_after(240):
            for _ in range(6):
                async def leader() -> Daemon | None:
                    lease = await get_lease(kube, env.namespace, names.LEADER_LEASE)
                    return next((d for d in replicas if lease is not None and lease.holder == d.name
                                 and d.proc.poll() is None), None)

                leading: Daemon = await eventually(leader, within=60, what="a replica leading")
                # The first kill lands around the first step (the create), the later ones anywhere.
                await anyio.sleep(rng.uniform(0.0, 1.5))
                leading.proc.send_signal(signal.SIGKILL)
                await leading.stop()
                killed += 1
                replicas.remove(leading)
                replicas.append(Daemon(env, tmp_path, f"replica-{started}"))
                started += 1

            async def named() -> dict[str, object] | None:
                cluster = await crds.clusters(kube).get(env.namespace, env.cluster_name)
                cond = find((cluster.get("status") or {}).get("conditions"), names.ROTATION_DUE)
                return cond if cond is not None and cond.get("reason") == \
                    names.RotationDueReason.AWAITING_APPROVAL else None

            cond = await eventually(named, within=60, what="RotationDue naming the planned operation")
            await eventually(lambda: env.management.requests.count("create", resource="talosoperations") >= 1,
                             within=5, what="the create in the request log")
            await anyio.sleep(1.0)  # a further step of the leader plans nothing more
    finally:
        for d in replicas:
            # 0 stopped, 1 leadership lost, -15 stopped before its signal handler was installed (just started)
            assert await d.stop() in (0, 1, -15), (seed, d.log()[-2000:])
    objs, _ = await crds.operations(kube).list_objects(env.namespace)
    assert len(objs) == 1, (seed, [o["metadata"]["name"] for o in objs])
    name = objs[0]["metadata"]["name"]
    assert objs[0]["spec"]["paused"] is True and objs[0]["spec"]["caRotation"]["targets"] == ["etcd"]
    assert name in str(cond["message"])
    created = [r for r in env.management.requests.entries
               if r.verb == "create" and r.resource == "talosoperations" and r.status == 201]
    assert len(created) == 1, (seed, created)
    events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
    planned = [e for e in events if e.get("reason") == names.EventReason.ROTATION_PLANNED]
    assert len(planned) == 1 and int(planned[0].get("count") or 1) == 1 and name in planned[0]["message"], seed
    assert killed == 6, seed
