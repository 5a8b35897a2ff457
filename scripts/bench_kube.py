#!/usr/bin/env python3
"""Benchmark the Kubernetes side on the simulator or the real API server; prints one JSON object.

- write->handler latency (p50/p99): a merge patch through the API until one informer's handler sees it
- events/s: a burst of concurrent creates through the API, and (simulator only) a burst written
  straight into the simulator's store (watch delivery alone), counted as they arrive at the handler
- requests/s: concurrent GETs of one ConfigMap through the real client over HTTPS

--target real runs a real etcd + kube-apiserver on loopback, started as the real test tier starts
them (tests/real/controlplane.py, binaries from scripts/tools.sh) with the chart's CRDs established.
--smoke is a small run that finishes in seconds; any run exits non-zero when it cannot produce its
figures (tools missing, a server that does not come up, a handler that never sees a write in time).

Usage: .venv/bin/python scripts/bench_kube.py [--target sim|real] [--smoke] [--writes 300] [--burst 1000]
       [--requests 2000] [--concurrency 16] [--deadline 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.real.controlplane: the real tier's server

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import GROUP, VERSION, machines
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from ichord.watchers import Informer, Resource, WatchEvent
from tests.real.controlplane import ControlPlane, ControlPlaneError

SMOKE = {"writes": 20, "burst": 50, "requests": 100, "concurrency": 4, "deadline": 120.0}

NS = "default"


def machine(name: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "spec": {"clusterRef": {"name": "c"}, "role": "worker"}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(kube: KubeClient, sim: KubeSimulator | None, writes: int, burst: int, requests: int,
                  concurrency: int) -> dict[str, object]:
    """The figures, through ``kube``; the watch-only burst needs the simulator's store (``sim``)."""
    ms = machines(kube)
    seen: dict[str, float] = {}
    arrivals: list[float] = []

    def on_event(e: WatchEvent) -> None:
        now = time.perf_counter()
        seen[e.obj["metadata"]["resourceVersion"]] = now
        arrivals.append(now)

    informer = Informer(kube, Resource(GROUP, VERSION, "talosmachines", NS), timing=Timing(), handlers=[on_event])
    result: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        await informer.wait_synced()
        await ms.create(NS, machine("lat"))
        latencies = []
        for i in range(writes):
            t0 = time.perf_counter()
            rv = (await ms.patch(NS, "lat", {"metadata": {"annotations": {"n": str(i)}}}))["metadata"][
                "resourceVersion"]
            while rv not in seen:  # noqa: ASYNC110  (spin on the handler's record: the measurement)
                await asyncio.sleep(0)
            latencies.append(seen[rv] - t0)
        result["write_to_handler_ms"] = {"p50": round(statistics.median(latencies) * 1000, 3),
                                         "p99": round(pct(latencies, 0.99) * 1000, 3), "samples": writes}

        arrivals.clear()
        sem = asyncio.Semaphore(concurrency)

        async def create(i: int) -> None:
            async with sem:
                await ms.create(NS, machine(f"b{i}"))
        t0 = time.perf_counter()
        async with anyio.create_task_group() as burst_tg:
            for i in range(burst):
                burst_tg.start_soon(create, i)
        while len(arrivals) < burst:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        result["informer_events_per_s_api_writes"] = round(burst / (arrivals[-1] - t0), 1)

        if sim is not None:
            # Watch delivery alone: the cluster's own writes go straight into the store.
            arrivals.clear()
            rt = sim.store.resolve(GROUP, VERSION, "talosmachines")
            t0 = time.perf_counter()
            for i in range(burst):
                sim.store.create(rt, NS, machine(f"s{i}"))
                if i % 50 == 0:
                    await asyncio.sleep(0)
            while len(arrivals) < burst:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            result["informer_events_per_s_watch_only"] = round(burst / (arrivals[-1] - t0), 1)

        core = kube.core()
        await core.create_namespaced_config_map(NS, {"metadata": {"name": "bench"}, "data": {"k": "v"}})
        done = 0

        async def reader() -> None:
            nonlocal done
            while done < requests:
                done += 1
                await core.read_namespaced_config_map("bench", NS)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as readers:
            for _ in range(concurrency):
                readers.start_soon(reader)
        result["get_requests_per_s"] = round(done / (time.perf_counter() - t0), 1)
        result["concurrency"] = concurrency
        result["watch_restarts"] = dict(informer.restarts)
        tg.cancel_scope.cancel()
    return result


async def bench_sim(writes: int, burst: int, requests: int, concurrency: int) -> dict[str, object]:
    async with KubeSimulator() as sim:
        with tempfile.TemporaryDirectory() as tmp:
            kube = await from_kubeconfig(sim.write_kubeconfig(Path(tmp) / "kc"), timing=Timing())
        try:
            return {"target": "sim", **await measure(kube, sim, writes, burst, requests, concurrency)}
        finally:
            await kube.close()


async def bench_real(writes: int, burst: int, requests: int, concurrency: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-kube-real-") as tmp:
        plane = ControlPlane.from_tools(Path(tmp))
        try:
            t0 = time.perf_counter()
            await anyio.to_thread.run_sync(plane.start)
            await anyio.to_thread.run_sync(plane.establish_crds, DEFAULT_CRD_DIR)
            started = time.perf_counter() - t0
            kube = await from_kubeconfig(plane.admin_kubeconfig, timing=Timing())
            try:
                figures = await measure(kube, None, writes, burst, requests, concurrency)
            finally:
                await kube.close()
            return {"target": "real", "server_start_s": round(started, 1), **figures}
        except ControlPlaneError:
            raise
        except Exception as exc:
            raise ControlPlaneError(f"{exc!r}\n{plane.log_tails(20)}") from exc
        finally:
            plane.stop()


async def bench(target: str, writes: int, burst: int, requests: int, concurrency: int,
                deadline: float) -> dict[str, object]:
    run = bench_real if target == "real" else bench_sim
    with anyio.fail_after(deadline):
        result = await run(writes, burst, requests, concurrency)
    latency = result.get("write_to_handler_ms")
    if not isinstance(latency, dict) or latency.get("samples") != writes:
        raise ControlPlaneError(f"no write->handler figures: {result}")
    return result


def main() -> None:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the JSON result only
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("sim", "real"), default="sim")
    ap.add_argument("--smoke", action="store_true", help="a small run (seconds): " + json.dumps(SMOKE))
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--deadline", type=float, default=600.0, help="seconds before the run counts as failed")
    args = ap.parse_args()
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    try:
        result = asyncio.run(bench(args.target, args.writes, args.burst, args.requests, args.concurrency,
                                   args.deadline))
    except (ControlPlaneError, TimeoutError) as exc:
        print(f"bench_kube: no figures for --target {args.target}: {exc or 'deadline passed'}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
