"""The chaos tier for the ca-rotation (issue 19): the daemon as a subprocess, killed at every failpoint of the
rotation in turn, and separately SIGKILLed at random moments (seeded, the seed printed), restarted each time.

Every run checks the invariants of docs/decisions.md#invariants from the simulators, not from ichord's status: the
operation completes; every machine got exactly one apply per pass (none repeated after a kill); every node signs with
and trusts only the new CAs; the bundle Secret holds them and no rotation.yaml; the lock is released; no key
material in the daemons' logs. ``ICHORD_CHAOS_RUNS`` raises the number of random runs (default 1 in CI).
"""

from __future__ import annotations

import base64
import os
import random
import time
from pathlib import Path

import anyio
import pytest

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.leases import get_lease
from ichord.operations.lock import lock_name
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.sim.combined import SimEnvironment
from tests.chaos._chaos import kill_at_each_failpoint, on_new_talos_and_kubernetes_cas, sigkill_at_random
from tests.e2e._daemon import Daemon, eventually

# The e2e rotation's operator loop (its world, env and kube, comes through conftest.py).
from tests.e2e.test_ca_rotation_daemon import _follow

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]

#: Every failpoint of the ca-rotation, in the order one rotation passes them (failpoints.py,
#: docs/decisions.md#invariants).
FAILPOINTS = [
    "ca-rotation.save.before", "ca-rotation.custody.kept", "ca-rotation.saved",
    "ca-rotation.apiserver.recorded",  # the first control plane's kube-apiserver recorded, before its apply
    "ca-rotation.apply.before.accepting", "ca-rotation.apply.after.accepting",
    "ca-rotation.apply.before.issuing", "ca-rotation.apply.after.issuing",
    "ca-rotation.apply.before.dropping", "ca-rotation.apply.after.dropping",
    "ca-rotation.replace.before", "ca-rotation.replace.after",
    "ca-rotation.restart.before", "ca-rotation.restart.after",
    "ca-rotation.custody.released", "ca-rotation.done.before",
]


#: Failpoints a default rotation (talos, kubernetes) never passes, and where each is killed at instead.
OFF_THE_DEFAULT_PATH = {
    "ca-rotation.abandon.remove.before": "tests/integration/test_ca_rotation_abandon.py",
    "ca-rotation.abandon.remove.after": "tests/integration/test_ca_rotation_abandon.py",
    "ca-rotation.abandon.letgo.before": "tests/integration/test_ca_rotation_abandon.py",
    "ca-rotation.aggregator.delete.before": "tests/chaos/test_ca_rotation_aggregator_chaos.py",
    "ca-rotation.aggregator.delete.after": "tests/chaos/test_ca_rotation_aggregator_chaos.py",
    "ca-rotation.custody.restored": "tests/chaos/test_custody_chaos.py",
}


def test_the_list_names_every_failpoint_of_the_rotation() -> None:
    """A failpoint added to the rotation without a place here fails this test."""
    import re

    root = Path(__file__).resolve().parents[2] / "ichord" / "operations" / "ca_rotation"
    names_in_code = set()
    for path in root.glob("*.py"):
        for m in re.finditer(r'failpoint\(f?"(ca-rotation\.[a-z.{}_()]+)"\)', path.read_text()):
            names_in_code.add(m.group(1))
    expanded = set()
    for n in names_in_code:
        if "{" in n:
            expanded |= {n.split("{")[0] + s for s in ("accepting", "issuing", "dropping")}
        else:
            expanded.add(n)
    assert expanded == set(FAILPOINTS) | set(OFF_THE_DEFAULT_PATH)


async def _create(kube: KubeClient, env: SimEnvironment) -> SecretsBundle:
    old = _secret(env)[0]
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
    return old


def _secret(env: SimEnvironment) -> tuple[SecretsBundle, set[str]]:
    store = env.management.store
    obj = store.get(store.resolve("", "v1", "secrets"), env.namespace, env.secret_name)
    data = {k: base64.b64decode(v) for k, v in obj["data"].items()}
    return SecretsBundle.from_yaml(data[names.SECRETS_KEY]), set(data)


async def _invariants(kube: KubeClient, env: SimEnvironment, old: SecretsBundle, daemons: list[Daemon]) -> None:
    op = await crds.operations(kube).get(env.namespace, "rotate")
    assert op["status"]["phase"] == "Completed", op["status"]
    for m in env.machine_names:  # one apply per pass, none repeated after any kill (from the node's history)
        assert len(env.applies(m)) == 3, (m, env.applies(m))
    new, keys = _secret(env)
    assert keys == {names.SECRETS_KEY}  # rotation.yaml gone, secrets.yaml replaced
    assert ca_fingerprint(new.os) != ca_fingerprint(old.os) and ca_fingerprint(new.k8s) != ca_fingerprint(old.k8s)
    assert (new.cluster_id, new.cluster_secret) == (old.cluster_id, old.cluster_secret)
    on_new_talos_and_kubernetes_cas(env, new)
    async def let_go() -> bool:
        # Completed may have been written by a daemon killed before it let go: the next leader lets go.
        lease = await get_lease(kube, env.namespace, lock_name(env.cluster_name))
        op = await crds.operations(kube).get(env.namespace, "rotate")
        return (lease is None or lease.holder is None) and not op["metadata"].get("finalizers")

    await eventually(let_go, within=60, what="the lock released and the finalizer removed")
    for d in daemons:  # no key material in any log
        log = d.log()
        for secret in (new.os.key_pem, new.k8s.key_pem, old.os.key_pem, old.k8s.key_pem):
            assert secret is not None and secret.decode().splitlines()[1] not in log


async def test_killed_at_every_failpoint_in_turn_the_rotation_completes(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    old = await _create(kube, env)
    seen: list[str] = []
    daemons = await kill_at_each_failpoint(
        env, tmp_path, FAILPOINTS, lambda d: _follow(kube, env, seen, stop=lambda: d.proc.poll() is not None))
    last = Daemon(env, tmp_path, "fp-last")
    daemons.append(last)
    try:
        with anyio.fail_after(120):
            await _follow(kube, env, seen)
        await _invariants(kube, env, old, daemons)
    finally:
        assert await last.stop() == 0


async def test_sigkilled_at_random_moments_the_rotation_completes(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    seed = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
    rng = random.Random(seed)
    kills = int(os.environ.get("ICHORD_CHAOS_KILLS") or 6)
    print(f"chaos seed {seed}, {kills} kills (ICHORD_CHAOS_SEED={seed} repeats it)")
    old = await _create(kube, env)
    seen: list[str] = []
    daemons = await sigkill_at_random(env, tmp_path, rng, kills, lambda: _follow(kube, env, seen))
    last = Daemon(env, tmp_path, "rand-last")
    daemons.append(last)
    try:
        with anyio.fail_after(180):
            await _follow(kube, env, seen)
        await _invariants(kube, env, old, daemons)
    finally:
        assert await last.stop() == 0, f"seed {seed}"
