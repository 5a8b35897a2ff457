"""The chaos tier's faults (issue 19): while the daemon (a subprocess) rotates the CAs, a seeded driver injects,
at random moments and for random spans, what production does to it:

- the management API: 409 on writes, 429, 500, 503 at random on a verb; an outage (connection refused,
  open watches cut) of 30-90 s of the daemon's time; watches dropped after the history was compacted, so
  the informers' next watch is 410 Gone and they list again;
- the managed cluster's API: 429/500/503 on a verb (the Node reads, kube-root-ca.crt, the restarts);
- Talos: a node that stops answering (sometimes in the middle of an apply), a slow apply, an apply the node
  refuses for a while;
- and now and then SIGKILL of the daemon, which is then restarted.

Then every fault is lifted and the rotation must complete with testing.md's invariants, read from the
simulators (the same checks as the kill tests: one apply per pass and machine, the nodes on the new CAs
only, the Secret replaced, no rotation.yaml, the lock and finalizer gone, no key material in any log).
The operator's part (the hand-off) is played on the simulator's store directly, so the test itself is not
subject to the faults it injects. ``ICHORD_CHAOS_SEED`` replays a run (the seed is printed);
``ICHORD_CHAOS_FAULT_RUNS=N`` makes N runs with consecutive seeds, each on a fresh cluster (CI makes one).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.kube.client import KubeClient
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.sim.combined import SimEnvironment
from ichord.sim.kube import KubeSimulator
from tests.chaos.test_ca_rotation_chaos import _create, _invariants
from tests.e2e._daemon import DAEMON_TIME_SCALE, Daemon

pytestmark = [pytest.mark.anyio, pytest.mark.chaos, pytest.mark.slow]

SCALE = float(DAEMON_TIME_SCALE)
VERBS = ("get", "list", "watch", "create", "update", "patch")


@dataclass
class Chaos:
    env: SimEnvironment
    rng: random.Random
    workdir: Path
    daemons: list[Daemon] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    lifts: list[Callable[[], Any]] = field(default_factory=list)

    def start_daemon(self) -> Daemon:
        daemon = Daemon(self.env, self.workdir, f"faults-{len(self.daemons)}")
        self.daemons.append(daemon)
        return daemon

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    def span(self, low: float, high: float) -> float:
        """A fault's duration: ``low``..``high`` seconds of the daemon's time (its Timing is scaled)."""
        return self.rng.uniform(low, high) * SCALE

    # ---- the faults ---------------------------------------------------------------------------

    async def api_errors(self, sim: KubeSimulator, label: str, codes: tuple[int, ...]) -> None:
        verb, code = self.rng.choice(VERBS), self.rng.choice(codes)
        if code == 409 and verb not in ("update", "patch"):
            verb = "patch"  # a Conflict answers a write
        rate = self.rng.uniform(0.2, 0.6)
        self.injected.append(f"{label} {verb} {code} x{rate:.1f}")
        sim.faults.error_code = code
        sim.faults.error_rate = {verb: rate}
        await anyio.sleep(self.span(10, 60))
        sim.faults.error_rate = {}

    async def management_outage(self) -> None:
        self.injected.append("management outage")
        async with self.env.management.outage():
            await anyio.sleep(self.span(30, 90))

    async def watches_expired(self) -> None:
        self.injected.append("watches dropped after compaction (410)")
        self.env.management.compact()
        self.env.management.drop_watches()
        await anyio.sleep(self.span(5, 20))

    async def node_unreachable(self) -> None:
        machine = self.rng.choice(self.env.machine_names)
        self.injected.append(f"{machine} unreachable")
        await self.env.set_unreachable(machine, True)
        try:
            await anyio.sleep(self.span(10, 60))
        finally:
            await self.env.set_unreachable(machine, False)

    async def slow_node(self) -> None:
        node = self.env.node(self.rng.choice(self.env.machine_names))
        self.injected.append(f"{node.name} slow")
        node.faults.slow = self.span(5, 30)
        await anyio.sleep(self.span(20, 60))
        node.faults.slow = 0.0

    async def apply_refused(self) -> None:
        node = self.env.node(self.rng.choice(self.env.machine_names))
        self.injected.append(f"{node.name} refuses applies")
        node.faults.apply_error = "chaos: the node refused the configuration for a while"
        await anyio.sleep(self.span(10, 40))
        node.faults.apply_error = None

    async def kill(self) -> None:
        self.injected.append("SIGKILL")
        if self.daemon.proc.poll() is None:
            self.daemon.proc.send_signal(signal.SIGKILL)
        await self.daemon.stop()
        self.start_daemon()

    async def one(self) -> None:
        faults = [
            lambda: self.api_errors(self.env.management, "management", (409, 429, 500, 503)),
            lambda: self.api_errors(self.env.kube, "managed", (429, 500, 503)),
            self.management_outage, self.watches_expired, self.node_unreachable, self.slow_node,
            self.apply_refused, self.kill,
        ]
        await self.rng.choice(faults)()

    def lift_all(self) -> None:
        for sim in (self.env.management, self.env.kube):
            sim.faults.error_rate = {}
        for name in self.env.machine_names:
            node = self.env.node(name)
            node.faults.slow, node.faults.apply_error = 0.0, None


def _operation(env: SimEnvironment) -> dict[str, Any]:
    store = env.management.store
    return store.get(store.resolve("ichor.maesh.dev", "v1alpha1", "talosoperations"), env.namespace, "rotate")


async def _operator(env: SimEnvironment, seen: list[str]) -> dict[str, Any]:
    """The operator, on the simulator's store (never through the faulted API): note the stages, acknowledge
    the credentials hand-off; return the operation once it is Completed or Failed."""
    store = env.management.store
    rt = store.resolve("ichor.maesh.dev", "v1alpha1", "talosoperations")
    while True:
        op = _operation(env)
        status = op.get("status") or {}
        stage = (status.get("caRotation") or {}).get("stage")
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
        if stage == "AwaitingCredentials":
            token = handoff_token(status["caRotation"]["certificates"])
            if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
                store.patch(rt, env.namespace, "rotate", "application/merge-patch+json", {"metadata": {
                    "annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})
        if status.get("phase") in ("Completed", "Failed"):
            return op
        await anyio.sleep(0.02)


async def _one_run(env: SimEnvironment, kube: KubeClient, workdir: Path, seed: int) -> None:
    rng = random.Random(seed)
    print(f"chaos faults seed {seed} (ICHORD_CHAOS_SEED={seed} repeats it)")
    old = await _create(kube, env)
    chaos = Chaos(env, rng, workdir)
    chaos.start_daemon()
    seen: list[str] = []
    done = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            async def inject() -> None:
                while not done.is_set():
                    await anyio.sleep(rng.uniform(0.2, 1.5))
                    if not done.is_set():
                        await chaos.one()

            async def restart_policy() -> None:
                # The Deployment's part: a daemon that exited (leadership lost in an outage: exit 1) is restarted.
                while not done.is_set():
                    if chaos.daemon.proc.poll() is not None:
                        chaos.injected.append(f"exited {chaos.daemon.proc.returncode}, restarted")
                        chaos.start_daemon()
                    await anyio.sleep(0.1)

            tg.start_soon(inject)
            tg.start_soon(restart_policy)
            with anyio.fail_after(240):
                op = await _operator(env, seen)
            done.set()
        chaos.lift_all()
        assert op["status"]["phase"] == "Completed", (seed, chaos.injected, op["status"])
        print(f"seed {seed}: {len(chaos.injected)} faults: {'; '.join(chaos.injected)}; stages {seen}")
        await _invariants(kube, env, old, chaos.daemons)
    except BaseException:
        print(f"seed {seed} failed after faults: {chaos.injected}\n{chaos.daemon.log()[-4000:]}")
        raise
    finally:
        chaos.lift_all()
        for daemon in chaos.daemons:
            code = await daemon.stop()
            # 0: stopped; SIGKILLed; 1 only after losing leadership (run_cli: one JSON line, then exit 1).
            assert code in (0, -9, 137) or (code == 1 and "leadership lost" in daemon.log()), (seed, code)


BASE_SEED = int(os.environ.get("ICHORD_CHAOS_SEED") or time.time_ns() % 1_000_000)
RUNS = int(os.environ.get("ICHORD_CHAOS_FAULT_RUNS") or 1)


@pytest.mark.parametrize("run", range(RUNS))
async def test_faulted_at_random_the_rotation_completes(run: int, env: SimEnvironment, kube: KubeClient,
                                                        tmp_path: Path) -> None:
    await _one_run(env, kube, tmp_path, BASE_SEED + run)
