"""The self-hosted scenario (issue 8): two replicas of `ichord run` whose API server is the managed cluster's own.

The API server's serving certificate switches to the new Kubernetes CA at Issuing; each replica's base
CA file (a pod's projected ca.crt, simulated) follows only ~80 s (scaled) later; the operator hands over
7 s (scaled) after Accepting, as on hardware, where Accepting -> Issuing took 6-8 s. The simulator's
four applies cost real CPU the time scale cannot shrink, so its switch comes later than that; the
follower, which has no tick, must still publish within the hardware's 6 s. With the trust pool
neither replica sees an x509 failure, the leader keeps its lease, the follower's informers keep going,
and a follower restarted in the window trusts the new CA at once from its kept trust file. With the
pool off the failures show.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import KubeError
from ichord.kube.leases import LeaseRecord, get_lease
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.pki import pem as _pem
from ichord.sim.combined import SimEnvironment
from ichord.sim.talos.run import scaled
from tests.e2e._daemon import DAEMON_TIME_SCALE, Daemon, all_ready, eventually
from tests.e2e.conftest import E2E_TIME_SCALE, MakeSimEnv

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SCALE = float(DAEMON_TIME_SCALE)
assert SCALE == E2E_TIME_SCALE  # one clock for the simulator and the daemons
#: kube-root-ca.crt is republished 5 s after the switch (the simulator's lag), the projected file 75 s later.
PROJECTED_LAG = 75.0
ACCEPTING_TO_ISSUING = (6.0 * SCALE, 8.0 * SCALE)
#: What a client x509 failure looks like in a replica's log (TLSVerificationError, or ssl's own words).
X509 = ("certificate is not trusted", "CERTIFICATE_VERIFY_FAILED", "certificate verify failed")


class Replica(Daemon):
    """`ichord run` with the trust flags: the projected ca.crt as the pool's base, its own trust file."""

    def __init__(self, env: SimEnvironment, workdir: Path, name: str, *, projected: Path, pool: bool = True) -> None:
        self.env = env
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"
        self.trust_file = workdir / name / "kubernetes-ca.crt"  # the pod's emptyDir: kept across restarts
        self._log = self.log_path.open("ab")
        environ = {**os.environ, "ICHORD_TIME_SCALE": DAEMON_TIME_SCALE, "HOME": str(workdir)}
        environ.pop("KUBECONFIG", None)
        args = [sys.executable, "-m", "ichord.cli", "run", "--kubeconfig", str(env.kubeconfig),
                "--ca-file", str(projected), "--trust-file", str(self.trust_file),
                # No fallback tick within the test: only the informer's events can publish in time.
                "--trust-sync-tick", "3600",
                "--controller-namespace", env.namespace, "--identity", name, "--metrics-addr", "127.0.0.1:0",
                "--port-file", str(self.port_file), "--force", "--resync", "1", "--log-level", "debug"]
        if not pool:
            args.append("--no-trust-pool")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=environ)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.log().splitlines():
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def x509_failures(self, after: float = 0.0) -> list[str]:
        """Log lines naming a client x509 failure, written after the wall time ``after``."""
        return [json.dumps(line) for line in self.lines()
                if _wall(line) >= after and any(mark in json.dumps(line) for mark in X509)]

    def first(self, event: str, **fields: Any) -> float | None:
        for line in self.lines():
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items()):
                return _wall(line)
        return None


def _absent(path: Path) -> bool:
    return not path.exists()


def _wall(line: dict[str, Any]) -> float:
    stamp = line.get("timestamp")
    return dt.datetime.fromisoformat(str(stamp)).timestamp() if stamp else 0.0


@dataclass
class Timeline:
    stages: dict[str, float] = field(default_factory=dict)  # first wall time each stage was seen
    lease: list[LeaseRecord] = field(default_factory=list)  # every distinct leader Lease read


@pytest.fixture
async def env(make_sim_env: MakeSimEnv, tmp_path: Path) -> SimEnvironment:
    # The nodes' own delays (kube-apiserver restarts after each apply) at 1/10 of the e2e scale, to keep
    # the Accepting pass as short as the simulator allows (its applies' CPU time does not scale).
    return await make_sim_env(management_api="self", projected_ca_path=tmp_path / "projected-ca.crt",
                              projected_ca_lag=PROJECTED_LAG, timings=scaled(E2E_TIME_SCALE / 10))


@pytest.fixture
async def kube(env: SimEnvironment) -> AsyncIterator[KubeClient]:
    """The test's own client: the simulator's current CA, re-read per request (it is the test, not a pod)."""
    client = await from_kubeconfig(env.kubeconfig, trust=lambda: [env.kube.ca_pem])
    yield client
    await client.close()


async def _leader(kube: KubeClient, env: SimEnvironment) -> LeaseRecord | None:
    return await get_lease(kube, env.namespace, names.LEADER_LEASE)


async def _rotate(kube: KubeClient, env: SimEnvironment, timeline: Timeline, *, stop_after: float | None = None,
                  on_switch: Callable[[], None] | None = None, within: float = 120.0) -> dict[str, Any]:
    """Create the rotation and play the operator: acknowledge once Accepting began 6-8 s (scaled) ago.

    Returns the operation when it completes or fails, or ``stop_after`` seconds after the switch."""
    await crds.operations(kube).create(env.namespace, {"metadata": {"name": "rotate"}, "spec": {
        "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation"}})
    acked = False
    with anyio.fail_after(within):
        while True:
            try:
                op = await crds.operations(kube).get(env.namespace, "rotate")
                lease = await _leader(kube, env)
            except KubeError:  # the API server restarts for the new CAs: look again
                await anyio.sleep(0.01)
                continue
            if lease is not None and (not timeline.lease or timeline.lease[-1] != lease):
                timeline.lease.append(lease)
            status = op.get("status") or {}
            stage = str((status.get("caRotation") or {}).get("stage") or "")
            if stage and stage not in timeline.stages:
                timeline.stages[stage] = time.time()
            accepting = timeline.stages.get("Accepting")
            if (stage == "AwaitingCredentials" and not acked and accepting is not None
                    and time.time() - accepting >= sum(ACCEPTING_TO_ISSUING) / 2):
                token = handoff_token(status["caRotation"]["certificates"])
                with contextlib.suppress(KubeError):
                    await crds.operations(kube).patch(env.namespace, "rotate", {"metadata": {
                        "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
                    acked = True
            if status.get("phase") in ("Completed", "Failed"):
                return op
            switch = _switched_at(env)
            if switch is not None and on_switch is not None:
                on_switch()
                on_switch = None
            if stop_after is not None and switch is not None and time.time() - switch >= stop_after:
                return op
            await anyio.sleep(0.01)


def _switched_at(env: SimEnvironment) -> float | None:
    for rec in env.kube.outages:
        if rec["kind"] == "serving_ca_switch":
            return float(rec["wall"])  # type: ignore[arg-type]
    return None


async def _two_replicas(env: SimEnvironment, kube: KubeClient, tmp_path: Path, projected: Path,
                        pool: bool) -> tuple[Replica, Replica]:
    leader = Replica(env, tmp_path, "replica-0", projected=projected, pool=pool)
    await eventually(lambda: _holder_is(kube, env, "replica-0"), within=30, what="replica-0 leads")
    follower = Replica(env, tmp_path, "replica-1", projected=projected, pool=pool)
    await eventually(lambda: all_ready(kube, env), within=60, what="every machine converged")
    await eventually(lambda: follower.first("informer synced") is not None, within=30, what="the follower synced")
    return leader, follower


async def _holder_is(kube: KubeClient, env: SimEnvironment, name: str) -> bool:
    try:
        lease = await _leader(kube, env)
    except KubeError:
        return False
    return lease is not None and lease.holder == name


async def test_with_the_pool_no_replica_fails_x509_and_the_leader_keeps_its_lease(
        env: SimEnvironment, kube: KubeClient, tmp_path: Path) -> None:
    projected = tmp_path / "projected-ca.crt"
    old_ca = projected.read_bytes()
    leader, follower = await _two_replicas(env, kube, tmp_path, projected, pool=True)
    replicas = [leader, follower]
    timeline = Timeline()

    def restart_follower() -> None:
        # A container restart in the window: a new process, the emptyDir file kept, ca.crt still the old CA.
        follower.kill()
        assert projected.read_bytes() == old_ca and follower.trust_file.exists()
        replicas.append(Replica(env, tmp_path, "replica-1", projected=projected))

    try:
        before = await _leader(kube, env)
        assert before is not None and before.holder == "replica-0"
        op = await _rotate(kube, env, timeline, on_switch=restart_follower)
        assert op["status"]["phase"] == "Completed", (op["status"], leader.log()[-3000:])
        switch = _switched_at(env)
        assert switch is not None
        new_ca = env.kube.ca_pem
        assert new_ca != old_ca
        restarted = replicas[2]

        # Both replicas trusted the new CA before the switch, from an event: the follower never ran the rotation.
        accepting = leader.first("ca-rotation stage", to="Accepting")
        published = {r.name: r.first("trusting an extra Kubernetes CA") for r in (leader, follower)}
        assert accepting is not None and all(t is not None and t < switch for t in published.values()), published
        follower_latency = (published["replica-1"] or 0.0) - accepting
        print(f"follower published {follower_latency * 1000:.0f} ms after the Accepting status; "
              f"the switch came {switch - accepting:.2f} s after it; stages "
              f"{ {k: round(v - timeline.stages['Accepting'], 3) for k, v in timeline.stages.items()} }")
        # Hardware saw the switch 6-8 s after Accepting. The simulator's applies cost CPU that the time scale
        # cannot shrink, so its own window is longer; what the scenario needs is that the follower, with no
        # tick, publishes inside the hardware's window: it does so from the informer's event alone.
        assert follower_latency < ACCEPTING_TO_ISSUING[0], (follower_latency, ACCEPTING_TO_ISSUING)
        # The restarted follower loaded the kept file before its first request and never failed x509.
        loaded = [line for line in restarted.lines()
                  if line.get("event") == "loaded extra Kubernetes CAs from the trust file"]
        assert loaded and loaded[-1]["count"] == 1, restarted.log()[-2000:]
        assert not [line for line in restarted.lines() if line.get("event") == "waiting for the Kubernetes API"
                    and _wall(line) > switch]

        # The projected ca.crt carries the new CA; every replica then dropped its extras (the base suffices).
        await eventually(lambda: _pem.pem_blocks(projected.read_bytes()) == _pem.pem_blocks(new_ca), within=20,
                         what="the projected ca.crt refreshed")
        for r in (leader, restarted):
            await eventually(functools.partial(_absent, r.trust_file), within=10, what=f"{r.name} cleared its pool")

        # No x509 failure on any replica at any time, the leader kept its lease all along.
        for r in replicas:
            assert r.x509_failures() == [], (r.name, r.x509_failures()[:3])
        assert leader.proc.poll() is None and restarted.proc.poll() is None
        assert "leader election lost" not in leader.log()
        after = await _leader(kube, env)
        assert after is not None and (after.holder, after.transitions) == ("replica-0", before.transitions)
        assert {rec.holder for rec in timeline.lease} == {"replica-0"}
    finally:
        for r in replicas:
            await r.stop()


async def test_without_the_pool_the_same_scenario_fails_x509(env: SimEnvironment, kube: KubeClient,
                                                             tmp_path: Path) -> None:
    projected = tmp_path / "projected-ca.crt"
    leader, follower = await _two_replicas(env, kube, tmp_path, projected, pool=False)
    timeline = Timeline()
    try:
        await _rotate(kube, env, timeline, stop_after=40 * SCALE)  # well inside the ~80 s (scaled) window
        switch = _switched_at(env)
        assert switch is not None
        for r in (leader, follower):
            assert r.x509_failures(after=switch), (r.name, r.log()[-2000:])
            assert r.first("trusting an extra Kubernetes CA") is None and not r.trust_file.exists()
    finally:
        for r in (leader, follower):
            await r.stop()
