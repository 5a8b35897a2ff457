"""The chaos tier's faults (issue 19), one scenario per operation: while the daemon (a subprocess) runs it, the
seeded driver of _chaos.py injects API errors and resets, a management outage, 410s, unreachable, vanishing,
slow and refusing Talos nodes, and SIGKILLs. Then every fault is lifted and the operation must complete with
the invariants of docs/decisions.md#invariants, read from the simulators' history and state (never from ichord's
status):

- ``ca-rotation``: talos + kubernetes on 3 control planes + 1 worker: one apply per pass and machine (none
  repeated), no reboot, every node signing with and trusting only the new CAs, the Secret holding them;
- ``etcd``: the etcd roll on 3 control planes + 1 worker: one round of control-plane reboots per pass (none
  twice), quorum never lost, members always trusting each other, no reboot while a member is unhealthy, every
  member on the new etcd CA alone, the worker never rebooted;
- ``aggregator``: kubernetes-aggregator on v1.14: no two kube-apiservers restarting at once, every one on the
  new CAs at the end, extension-apiserver-authentication holding the new front-proxy CA alone;
- ``config``: a reboot-class patch over 3 control planes + 3 workers (maxUnavailable 2): each node staged
  once and rebooted once, control planes one at a time, at most 2 workers down together, quorum kept, every
  node running the patched configuration;

and for all: Completed, no rotation.yaml, the lock and the finalizer gone, no Node cordoned, no key material in
the daemons' logs, any status or Event.

``ICHORD_CHAOS_SEED`` is the first seed (printed; each scenario's run ``i`` uses seed+i), ``ICHORD_CHAOS_FAULT_RUNS``
the runs per scenario (CI: 1), ``ICHORD_CHAOS_SCENARIOS`` a comma-separated choice (default all).
"""

from __future__ import annotations

import base64
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ichord.api import names
from ichord.contract import V1_14
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests._etcd_history import ca_fp, etcd_violations, final_trust
from tests.chaos._chaos import (
    Chaos,
    SecretHistory,
    common_invariants,
    inject_until,
    on_new_talos_and_kubernetes_cas,
    operator,
)
from tests.e2e._daemon import all_ready, eventually
from tests.e2e.conftest import MakeSimEnv
from tests.e2e.test_ca_rotation_aggregator_daemon import _apiservers_on, _ext_auth
from tests.e2e.test_ca_rotation_etcd_daemon import CLIENTS, _workload
from tests.integration._apiserver_history import overlapping_restarts
from tests.integration._config_world import REBOOT_PATCH

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]

CONFIG_MAX_UNAVAILABLE = 2


def bundle_of(env: SimEnvironment) -> SecretsBundle:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    return SecretsBundle.from_yaml(base64.b64decode(obj["data"][names.SECRETS_KEY]))


def control_planes(env: SimEnvironment) -> list[str]:
    return [m for m in env.machine_names if env.node(m).is_control_plane]


def applies_since(env: SimEnvironment, machine: str, since: int) -> list[str]:
    node = env.node(machine).name
    return [e["config_hash"] for e in env.talos.history.since(since) if e["kind"] == "apply" and e["node"] == node]


def reboots_since(env: SimEnvironment, since: int) -> dict[str, int]:
    out = {m: 0 for m in env.machine_names}
    names_ = {env.node(m).name: m for m in env.machine_names}
    for e in env.talos.history.since(since):
        if e["kind"] == "reboot":
            out[names_[e["node"]]] += 1
    return out


def most_rebooting_at_once(env: SimEnvironment, machines: list[str], since: int) -> int:
    """The most of ``machines`` down for a reboot together (a fault's "unreachable" is not the daemon's doing)."""
    watched = {env.node(m).name for m in machines}
    down: set[str] = set()
    most = 0
    for e in env.talos.history.since(since):
        if e.get("node") not in watched:
            continue
        if e["kind"] == "shutting_down":
            down.add(e["node"])
        elif e["kind"] == "reboot":
            down.discard(e["node"])
        most = max(most, len(down))
    return most


def distinct_per_stage(env: SimEnvironment, since: int, per_machine: Callable[[str], int]) -> None:
    """Each machine got exactly ``per_machine(m)`` applies, all different (none repeated in a stage)."""
    for m in env.machine_names:
        got = applies_since(env, m, since)
        assert len(got) == per_machine(m) and len(set(got)) == len(got), (m, got)


@dataclass
class Baseline:
    bundle: SecretsBundle
    since: int
    secret: SecretHistory


# ---- the scenarios -------------------------------------------------------------------------------


async def rotation_start(env: SimEnvironment, targets: list[str]) -> None:
    async with await from_kubeconfig(env.kubeconfig) as kube:
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "op"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": targets}}})


def check_talos_kubernetes(env: SimEnvironment, base: Baseline) -> None:
    old, new = base.bundle, bundle_of(env)
    assert base.secret.violations(base.since, rotation=True) == []
    distinct_per_stage(env, base.since, lambda _m: 3)
    assert sum(reboots_since(env, base.since).values()) == 0
    assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
    assert (new.cluster_id, new.cluster_secret) == (old.cluster_id, old.cluster_secret)
    on_new_talos_and_kubernetes_cas(env, new)


def check_etcd(env: SimEnvironment, base: Baseline) -> None:
    old, new = base.bundle, bundle_of(env)
    assert base.secret.violations(base.since, rotation=True) == []
    cps = control_planes(env)
    assert etcd_violations(env.talos.history.events, cps, rounds=3) == []
    assert reboots_since(env, base.since) == {m: 3 if m in cps else 0 for m in env.machine_names}
    distinct_per_stage(env, base.since, lambda m: 3 if m in cps else len(applies_since(env, m, base.since)))
    assert ca_fingerprint(new.etcd) != ca_fingerprint(old.etcd)
    assert ca_fingerprint(new.os) == ca_fingerprint(old.os)
    fp = ca_fp(new.etcd.cert_pem)
    assert final_trust(env.talos.etcd.state()) == {cp: (fp, [fp]) for cp in cps}


def check_aggregator(env: SimEnvironment, base: Baseline) -> None:
    old, new = base.bundle, bundle_of(env)
    assert base.secret.violations(base.since, rotation=True) == []
    assert new.k8s_aggregator.cert_pem != old.k8s_aggregator.cert_pem
    assert ca_fingerprint(new.k8s) == ca_fingerprint(old.k8s)
    assert _ext_auth(env) == _pem.pem_blocks(new.k8s_aggregator.cert_pem)  # the new front-proxy CA alone
    assert _apiservers_on(env, new) == []
    assert overlapping_restarts(env.talos.history.events) == []
    assert sum(reboots_since(env, base.since).values()) == 0
    distinct_per_stage(env, base.since, lambda m: len(applies_since(env, m, base.since)))


async def config_start(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig) as kube:
        await crds.clusters(kube).patch(env.namespace, env.cluster_name, {"spec": {"patches": [REBOOT_PATCH]}})

        async def reported() -> bool:
            objs, _ = await crds.machines(kube).list_objects(env.namespace)
            return sum(1 for o in objs if (o.get("status") or {}).get("rebootPaths")) == len(env.machine_names)

        await eventually(reported, within=60, what="every machine reporting rebootPaths")
        await crds.operations(kube).create(env.namespace, {"metadata": {"name": "op"}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": names.KIND_CONFIG,
            "maxUnavailable": CONFIG_MAX_UNAVAILABLE}})


def check_config(env: SimEnvironment, base: Baseline) -> None:
    cps = control_planes(env)
    workers = [m for m in env.machine_names if m not in cps]
    assert reboots_since(env, base.since) == {m: 1 for m in env.machine_names}
    assert most_rebooting_at_once(env, cps, base.since) == 1
    assert most_rebooting_at_once(env, workers, base.since) <= CONFIG_MAX_UNAVAILABLE
    assert etcd_violations(env.talos.history.events, cps, rounds=1) == []
    distinct_per_stage(env, base.since, lambda _m: 1)
    for m in env.machine_names:  # the node runs what it was given, and that holds the patch
        node = env.node(m)
        assert node.running.hash() == applies_since(env, m, base.since)[-1], m
        assert "br_netfilter" in node.running.to_yaml(), m
    assert base.secret.violations(base.since, rotation=False) == []


def kube_system_clients(env: SimEnvironment) -> None:
    """The CNI, kube-proxy and CoreDNS workloads a rotation restarts (as the e2e rotations have them)."""
    for plural, name in CLIENTS:
        env.kube.store.create(env.kube.store.resolve("apps", "v1", plural), "kube-system", _workload(plural, name))


@dataclass(frozen=True)
class Scenario:
    id: str
    env: dict[str, Any]
    start: Callable[[SimEnvironment], Awaitable[None]]
    check: Callable[[SimEnvironment, Baseline], None]
    prepare: Callable[[SimEnvironment], None] = lambda _env: None
    within: float = 240.0


SCENARIOS = {s.id: s for s in [
    Scenario("ca-rotation", {}, lambda env: rotation_start(env, ["talos", "kubernetes"]), check_talos_kubernetes,
             kube_system_clients),
    Scenario("etcd", {}, lambda env: rotation_start(env, ["etcd"]), check_etcd, kube_system_clients),
    Scenario("aggregator", {"contract": V1_14}, lambda env: rotation_start(env, ["kubernetes-aggregator"]),
             check_aggregator),
    Scenario("config", {"workers": 3}, config_start, check_config),
]}

BASE_SEED = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
RUNS = int(os.environ.get("ICHORD_CHAOS_FAULT_RUNS") or 1)
CHOSEN = [s for s in (os.environ.get("ICHORD_CHAOS_SCENARIOS") or ",".join(SCENARIOS)).split(",") if s]
if set(CHOSEN) - set(SCENARIOS):
    raise ValueError(f"ICHORD_CHAOS_SCENARIOS names {sorted(set(CHOSEN) - set(SCENARIOS))}; known: {list(SCENARIOS)}")


async def one_run(make_sim_env: MakeSimEnv, workdir: Path, scenario: Scenario, seed: int) -> None:
    print(f"chaos {scenario.id} seed {seed} (ICHORD_CHAOS_SCENARIOS={scenario.id} ICHORD_CHAOS_SEED={seed} "
          "repeats it)")
    env = await make_sim_env(management_api="separate", **scenario.env)
    assert env.bundle is not None
    scenario.prepare(env)
    chaos = Chaos(env, random.Random(f"{scenario.id}:{seed}"), workdir)  # the same seed, other faults per scenario
    chaos.start_daemon()
    seen: list[str] = []
    try:
        async with await from_kubeconfig(env.kubeconfig) as kube:
            await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
        base = Baseline(env.bundle, len(env.talos.history.events), SecretHistory(env))
        await scenario.start(env)
        op = await inject_until(chaos, lambda: operator(env, "op", seen), scenario.within)
        await chaos.lift_all()
        assert op["status"]["phase"] == "Completed", (seed, chaos.injected, op["status"])
        print(f"{scenario.id} seed {seed}: {len(chaos.injected)} faults: {'; '.join(chaos.injected)}; "
              f"stages {seen}")
        scenario.check(env, base)
        await common_invariants(env, "op", chaos.daemons, [base.bundle, bundle_of(env)])
    except BaseException:
        print(f"{scenario.id} seed {seed} failed after faults: {chaos.injected}\n{chaos.daemon.log()[-4000:]}")
        raise
    finally:
        await chaos.lift_all()
        await chaos.stop_all(seed)


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("scenario", CHOSEN)
async def test_faulted_at_random_the_operation_completes(scenario: str, run: int, make_sim_env: MakeSimEnv,
                                                         tmp_path: Path) -> None:
    await one_run(make_sim_env, tmp_path, SCENARIOS[scenario], BASE_SEED + run)
