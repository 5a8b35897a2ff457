#!/usr/bin/env python3
"""Benchmark the Kubernetes side on the simulator or the real API server; prints one JSON object.

- write->handler latency (p50/p99): a merge patch through the API until one informer's handler sees it
- events/s: a burst of concurrent creates through the API, and (simulator only) a burst written
  straight into the simulator's store (watch delivery alone), counted as they arrive at the handler
- requests/s: concurrent GETs of one ConfigMap through the real client over HTTPS

--target real runs a real etcd + kube-apiserver on loopback, started as the real test tier starts
them (tests/real/controlplane.py, binaries from scripts/tools.sh), with the chart's CRDs established;
it exits 1 when they are not built or do not come up, like any run that cannot produce its figures.

Usage: .venv/bin/python scripts/bench_kube.py [--target sim|real] [--writes 300] [--burst 1000]
       [--requests 2000] [--concurrency 16] [--smoke]
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
import benchkit
import structlog
from benchkit import Deadline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.real.controlplane: the real tier's server

from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import GROUP, VERSION, machines
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator
from ichord.sim.kube.server import DEFAULT_CRD_DIR
from ichord.watchers import Informer, Resource, WatchEvent
from tests.real.controlplane import ControlPlane, ControlPlaneError

NS = "default"
SMOKE = {"writes": 30, "burst": 100, "requests": 200, "concurrency": 8}
#: A lost event would spin forever: past this the benchmark exits without its figures.
WAIT_S = 60.0


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
            deadline = Deadline(WAIT_S, f"the handler to see write {i}")
            while rv not in seen:  # spin on the handler's record: the measurement
                deadline.check()
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
        deadline = Deadline(WAIT_S, f"the handler to see {burst} created objects")
        while len(arrivals) < burst:
            deadline.check()
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
            deadline = Deadline(WAIT_S, f"the handler to see {burst} objects written to the store")
            while len(arrivals) < burst:
                deadline.check()
                await asyncio.sleep(0.001)
            result["informer_events_per_s_watch_only"] = round(burst / (arrivals[-1] - t0), 1)

        # A ConfigMap of the run's own: a real server without kube-controller-manager has no kube-root-ca.crt.
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
        except (ControlPlaneError, SystemExit):
            raise
        except Exception as exc:
            raise ControlPlaneError(f"{exc!r}\n{plane.log_tails(20)}") from exc
        finally:
            plane.stop()


def main() -> None:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout: the JSON result only
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("sim", "real"), default="sim",
                    help="the simulator, or a real etcd + kube-apiserver built by scripts/tools.sh")
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    args = benchkit.parse_args(ap, SMOKE)
    run = bench_real if args.target == "real" else bench_sim
    try:
        result = asyncio.run(run(args.writes, args.burst, args.requests, args.concurrency))
    except ControlPlaneError as exc:
        print(f"{benchkit.name()}: no figures for --target real: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(json.dumps(result))
    figures = ["write_to_handler_ms.p50", "write_to_handler_ms.p99", "informer_events_per_s_api_writes",
               "get_requests_per_s"]
    if args.target == "sim":
        figures.append("informer_events_per_s_watch_only")
    benchkit.require(result, figures, equal={"write_to_handler_ms.samples": args.writes})


if __name__ == "__main__":
    main()
