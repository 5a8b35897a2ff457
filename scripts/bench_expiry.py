#!/usr/bin/env python3
"""Benchmark one CA expiry pass over N clusters against the Kubernetes API simulator; prints one JSON object.

The simulator runs on its own thread and event loop, so the pass's CPU (``time.thread_time`` of
the calling thread: bundle parsing, fingerprints, JSON, TLS) is measured apart from the server's.
Two passes are measured: the first, cold (every bundle parsed, status written for every cluster,
Events for the expiring ones) and the idle one an hour later (nothing changed: reads only, no
write, parsed bundles reused by content hash). Requests are counted
by the simulator, by verb and resource.

Usage: .venv/bin/python scripts/bench_expiry.py [--clusters 1000] [--expiring 0.1] [--concurrency 1] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import benchkit
import structlog

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters
from ichord.kube.events import EventRecorder
from ichord.operations import bundle_source
from ichord.operations.cert_expiry import expiry_pass, forget_cluster
from ichord.pki.bundle import generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, generate_ca
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator

NS = "bench"
SMOKE = {"clusters": 20}


class SimThread:
    """A KubeSimulator served from its own thread and event loop."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-sim", daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sim: KubeSimulator | None = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.sim = KubeSimulator()
        loop.run_until_complete(self.sim.start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.sim.stop())
        loop.close()

    def __enter__(self) -> KubeSimulator:
        self._thread.start()
        if not self._ready.wait(30) or self.sim is None:
            raise SystemExit("bench_expiry: the Kubernetes API simulator did not start within 30 s")
        return self.sim

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


def bundle_bytes(n: int, n_expiring: int) -> list[bytes]:
    """n bundles with distinct CAs on one service-account key (RSA generation would dominate otherwise)."""
    base = generate_bundle()
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=20)
    out = []
    for i in range(n):
        cas = {k: generate_ca(k) for k in CAKind}
        if i < n_expiring:
            cas[CAKind.KUBERNETES] = generate_ca(CAKind.KUBERNETES, now=soon - CA_VALIDITY)
        out.append(base.with_cas(cas).to_yaml().encode())
    return out


async def populate(kube: KubeClient, n: int, n_expiring: int) -> None:
    raws = bundle_bytes(n, n_expiring)
    await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
    objects = clusters(kube)
    limiter = anyio.CapacityLimiter(32)

    async def one(i: int) -> None:
        async with limiter:
            await kube.raw("POST", f"/api/v1/namespaces/{NS}/secrets", body={
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"c{i}-bundle"},
                "data": {"secrets.yaml": base64.b64encode(raws[i]).decode()}})
            await objects.create(NS, {"metadata": {"name": f"c{i}"}, "spec": {
                "secretsRef": {"name": f"c{i}-bundle"}, "endpoint": "https://10.0.0.1:6443",
                "kubernetesVersion": "1.34.1"}})

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)


async def one_pass(kube: KubeClient, sim: KubeSimulator, objs: list[dict[str, Any]], *, concurrency: int,
                   now: dt.datetime, timing: Timing) -> dict[str, Any]:
    recorder = EventRecorder(kube, instance="bench", burst=10_000)
    sim.requests.clear()
    limiter = anyio.CapacityLimiter(concurrency)
    delays: Counter[float] = Counter()

    async def one(obj: dict[str, Any]) -> None:
        async with limiter:
            delays[await expiry_pass(kube, obj, namespace_of_secret=NS, recorder=recorder, timing=timing,
                                     now=now)] += 1

    cpu, wall = time.thread_time(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for obj in objs:
            tg.start_soon(one, obj)
    await recorder.drain()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    by_verb = Counter(f"{e.verb} {e.resource}" for e in sim.requests.entries)
    return {
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
        "cpu_ms_per_cluster": round(1000 * cpu / len(objs), 3),
        "requests_total": len(sim.requests.entries),
        "requests_by_verb": dict(sorted(by_verb.items())),
        "requests_failed": sum(1 for e in sim.requests.entries if e.status >= 400),
        "next_pass_in_s": {str(k): v for k, v in delays.items()},
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    timing = Timing()
    with SimThread() as sim, tempfile.TemporaryDirectory() as tmp:
        kube = await from_kubeconfig(sim.write_kubeconfig(Path(tmp) / "kc", namespace=NS), timing=timing)
        async with kube:
            n_expiring = int(args.clusters * args.expiring)
            t0 = time.perf_counter()
            await populate(kube, args.clusters, n_expiring)
            setup = time.perf_counter() - t0
            objs, _rv = await clusters(kube).list_objects(NS)
            now = dt.datetime.now(dt.UTC)
            bundle_source._PUBLIC.clear()  # a cold start: every bundle's certificates parsed once
            first = await one_pass(kube, sim, objs, concurrency=args.concurrency, now=now, timing=timing)
            objs, _rv = await clusters(kube).list_objects(NS)
            idle = await one_pass(kube, sim, objs, concurrency=args.concurrency,
                                  now=now + dt.timedelta(hours=1), timing=timing)
            for obj in objs:
                forget_cluster(NS, obj["metadata"]["name"])
    return {
        "benchmark": "expiry_pass", "clusters": args.clusters, "expiring": n_expiring,
        "concurrency": args.concurrency, "setup_s": round(setup, 1),
        "first_pass": first, "idle_pass": idle,
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--expiring", type=float, default=0.1, help="fraction with a CA inside the window")
    parser.add_argument("--concurrency", type=int, default=1, help="passes in flight at once (1: one by one)")
    result = anyio.run(main, benchkit.parse_args(parser, SMOKE))
    print(json.dumps(result, indent=2))
    benchkit.require(result, [f"{p}.{f}" for p in ("first_pass", "idle_pass")
                              for f in ("wall_s", "cpu_ms_per_cluster", "requests_total")],
                     equal={"first_pass.requests_failed": 0, "idle_pass.requests_failed": 0})
