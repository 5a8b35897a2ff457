#!/usr/bin/env python3
"""How soon a follower replica trusts a rotation's new Kubernetes CA: event-driven sync vs the 10 s tick.

    .venv/bin/python scripts/bench_trust.py [--events 100] [--baseline-events 30] [--baseline-scale 0.05]
                                            [--workdir DIR]

One Kubernetes API simulator (this process) holds a TalosCluster, its bundle Secret and a leader Lease
held by another identity, so `ichord run` (a subprocess, real durations) stays a follower: informers and
the trust sync only. The simulator is the TalosCluster's own API server: it serves from the bundle's
Kubernetes CA, and the follower's base CA file (--ca-file, a pod's projected ca.crt) holds it, so the
trust pool's own-cluster rule lets the follower trust the cluster's rotations (another cluster's it
would ignore). For each of --events rotations this process writes a fresh rotation.yaml, creates the
TalosOperation (no status: the creation event is ignored), then writes the Accepting status and
measures until the follower's trust file holds the new CA. It then completes the operation as
Finalizing and Done leave it (the new CA current in secrets.yaml, rotation.yaml gone) and lets the
projected ca.crt carry the new CA, so the follower clears its pool before the next rotation. The
simulator keeps its serving certificate (no switch at Issuing): what is measured ends at the publish.

Baseline: the same TrustSync in this process with no event handler, only its tick (10 s x
--baseline-scale), over --baseline-events rotations; its latencies are divided by the scale, i.e. given
in real seconds. Without events the expectation is uniform on [0, 10 s]: p50 ~5 s, p99 ~9.9 s.

Figures, one JSON line each (stdout): event (p50/p90/p99/max ms over --events), baseline (the same in
seconds, unscaled), summary. --smoke: a few rotations of each, in seconds; exits non-zero without figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import Deadline

from ichord import log
from ichord.api.names import LEADER_LEASE, ROTATION_KEY, SECRETS_KEY
from ichord.contract import V1_14
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.rotation import Rotation, Target, generate_rotation
from ichord.settings import Timing
from ichord.sim.combined.objects import cluster_spec
from ichord.sim.kube import KubeSimulator, SimSettings
from ichord.trust.pool import TrustPool
from ichord.trust.sync import TrustSync

#: A few rotations of each: the follower's start (~3 s) dominates.
SMOKE = {"events": 5, "baseline_events": 3, "baseline_scale": 0.02}
NS = "ichord-system"
SECRET = "bench-secrets"
CLUSTER = "bench"


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    return {"n": len(ordered), "p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": ordered[-1],
            "mean": statistics.fmean(ordered)}


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


class World:
    def __init__(self, sim: KubeSimulator, bundle: SecretsBundle, projected: Path) -> None:
        self.sim = sim
        self.bundle = bundle  # the cluster's secrets.yaml: its Kubernetes CA is the one sim serves from
        self.projected = projected
        self.store = sim.store
        self.ops = sim.store.resolve(crds.GROUP, crds.VERSION, "talosoperations")
        self.secrets = sim.store.resolve("", "v1", "secrets")

    def setup(self) -> None:
        s = self.store
        s.create(s.resolve("", "v1", "namespaces"), None, {"metadata": {"name": NS}})
        s.create(self.secrets, NS, {"metadata": {"name": SECRET, "namespace": NS}, "type": "Opaque",
                                    "data": {SECRETS_KEY: _b64(self.bundle.to_yaml())}})
        s.create(s.resolve(crds.GROUP, crds.VERSION, "talosclusters"), NS, {
            "apiVersion": crds.API_VERSION, "kind": "TalosCluster", "metadata": {"name": CLUSTER, "namespace": NS},
            "spec": cluster_spec(secret=SECRET, endpoint=self.sim.url, contract=V1_14, cni="flannel")})
        # Another identity leads for a long time: the daemon under test stays a follower.
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        s.create(s.resolve("coordination.k8s.io", "v1", "leases"), NS, {
            "metadata": {"name": LEADER_LEASE, "namespace": NS},
            "spec": {"holderIdentity": "the-leader", "leaseDurationSeconds": 3600, "acquireTime": now,
                     "renewTime": now, "leaseTransitions": 0}})
        self.projected.write_bytes(self.sim.ca_pem)

    def new_rotation(self) -> Rotation:
        rotation = generate_rotation((Target.KUBERNETES,))
        obj = self.store.get(self.secrets, NS, SECRET)
        obj["data"] = {**obj["data"], ROTATION_KEY: _b64(rotation.to_yaml())}
        self.store.apply(self.secrets, obj)
        return rotation

    def create(self, name: str) -> None:
        self.store.create(self.ops, NS, {"apiVersion": crds.API_VERSION, "kind": "TalosOperation",
                                         "metadata": {"name": name, "namespace": NS},
                                         "spec": {"clusterRef": {"name": CLUSTER}, "kind": "ca-rotation"}})

    def status(self, name: str, phase: str, stage: str) -> None:
        obj = self.store.get(self.ops, NS, name)
        obj["status"] = {"phase": phase, "caRotation": {"stage": stage}}
        self.store.apply(self.ops, obj, subresource="status")

    def finish(self, name: str, rotation: Rotation) -> None:
        """Finalizing's bundle (the new CA current, rotation.yaml dropped), Completed, and the kubelet refreshed
        ca.crt (serving CA + the new one): the follower may clear, and trusts the next rotation as its own."""
        self.bundle = rotation.apply_to(self.bundle)
        obj = self.store.get(self.secrets, NS, SECRET)
        obj["data"] = {SECRETS_KEY: _b64(self.bundle.to_yaml())}
        self.store.apply(self.secrets, obj)
        # ca.crt first: the Completed event's pass clears at once (else the next tick, 10 s on, would).
        self.projected.write_bytes(self.sim.ca_pem + rotation.new[Target.KUBERNETES].cert_pem)
        self.status(name, "Completed", "Done")


async def _until(pred: Any, within: float, what: str) -> None:
    deadline = Deadline(within, what)
    while not pred():
        deadline.check()
        await asyncio.sleep(0.0005)


def _holds(path: Path, cert_pem: bytes) -> bool:
    try:
        return cert_pem in path.read_bytes()
    except OSError:
        return False


async def bench_events(world: World, workdir: Path, events: int) -> list[float]:
    trust_file = workdir / "follower" / "kubernetes-ca.crt"
    kubeconfig = world.sim.write_kubeconfig(workdir / "kubeconfig", namespace=NS)
    log = (workdir / "follower.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "ICHORD_TIME_SCALE")}
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, stopped below
        [sys.executable, "-m", "ichord.cli", "run", "--kubeconfig", str(kubeconfig), "--ca-file",
         str(world.projected), "--trust-file", str(trust_file), "--controller-namespace", NS, "--identity", "follower",
         "--metrics-addr", "127.0.0.1:0", "--log-level", "info"], stdout=log, stderr=subprocess.STDOUT, env=env)
    latencies: list[float] = []
    try:
        await _until(lambda: b"informer synced" in (workdir / "follower.log").read_bytes()
                     and (workdir / "follower.log").read_bytes().count(b"informer synced") >= 3, 60, "follower sync")
        for i in range(events):
            rotation = world.new_rotation()
            cert = rotation.new[Target.KUBERNETES].cert_pem
            name = f"rotate-{i}"
            world.create(name)
            await asyncio.sleep(0.02)  # the creation event arrives and is ignored
            t0 = time.perf_counter()
            world.status(name, "InProgress", "Accepting")
            await _until(lambda c=cert: _holds(trust_file, c), 30, f"the follower to publish rotation {i}")
            latencies.append(time.perf_counter() - t0)
            world.finish(name, rotation)
            await _until(lambda: not trust_file.exists(), 30, f"the follower to clear after rotation {i}")
            if proc.poll() is not None:
                raise SystemExit(f"bench_trust: the follower exited ({proc.returncode}); see {workdir}/follower.log")
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return latencies


async def bench_tick(world: World, workdir: Path, events: int, scale: float) -> list[float]:
    """The tick alone (no informer handler): what a 10 s poll gives, measured at ``scale`` and scaled back."""
    timing = dataclasses.replace(Timing(), trust_sync_tick=Timing().trust_sync_tick * scale)
    pool = TrustPool(world.projected)  # the same projected ca.crt as the follower's: it trusts this cluster
    kube = await from_kubeconfig(world.sim.write_kubeconfig(workdir / "kubeconfig-baseline", namespace=NS),
                                 trust=pool.source, timing=timing)
    trust_file = workdir / "baseline" / "kubernetes-ca.crt"
    sync = TrustSync(kube, pool, trust_file=trust_file, timing=timing)
    task = asyncio.get_running_loop().create_task(sync.run())
    latencies: list[float] = []
    try:
        for i in range(events):
            rotation = world.new_rotation()
            cert = rotation.new[Target.KUBERNETES].cert_pem
            name = f"tick-{i}"
            world.create(name)
            # A random phase against the tick, as a real rotation would start.
            await asyncio.sleep(timing.trust_sync_tick * ((i * 0.618) % 1.0))
            t0 = time.perf_counter()
            world.status(name, "InProgress", "Accepting")
            await _until(lambda c=cert: _holds(trust_file, c), 60 * scale + 5, f"the tick to publish {i}")
            latencies.append((time.perf_counter() - t0) / scale)
            world.finish(name, rotation)
            await _until(lambda: not trust_file.exists(), 60 * scale + 5, f"the tick to clear after {i}")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kube.close()
    return latencies


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--baseline-events", type=int, default=30)
    parser.add_argument("--baseline-scale", type=float, default=0.05)
    parser.add_argument("--workdir", type=Path, default=None)
    args = benchkit.parse_args(parser, SMOKE)
    log.configure("warning", json=True, stream=sys.stderr)  # stdout carries the figures only
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-trust-")))
        workdir.mkdir(parents=True, exist_ok=True)
        bundle = generate_bundle(V1_14)
        # The cluster's own API server: it serves from the bundle's Kubernetes CA (the own-cluster rule).
        async with KubeSimulator(SimSettings(token="bench-token"), ca=bundle.ca(CAKind.KUBERNETES)) as sim:
            world = World(sim, bundle, workdir / "projected-ca.crt")
            world.setup()
            events = await bench_events(world, workdir, args.events)
            ev = {k: (round(v * 1000, 2) if k != "n" else v) for k, v in _percentiles(events).items()}
            print(json.dumps({"figure": "event", "unit": "ms", **ev}), flush=True)
            baseline = await bench_tick(world, workdir, args.baseline_events, args.baseline_scale)
            bl = {k: (round(v, 3) if k != "n" else v) for k, v in _percentiles(baseline).items()}
            print(json.dumps({"figure": "baseline", "unit": "s", "tick_s": Timing().trust_sync_tick,
                              "measured_at_scale": args.baseline_scale, **bl}), flush=True)
            summary = {"figure": "summary", "event_p50_ms": ev["p50"], "event_p99_ms": ev["p99"],
                       "tick_p50_s": bl["p50"], "tick_p99_s": bl["p99"], "accepting_to_issuing_on_hardware_s": [6, 8]}
            print(json.dumps(summary), flush=True)
            benchkit.require(summary, ("event_p50_ms", "event_p99_ms", "tick_p50_s", "tick_p99_s"))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
