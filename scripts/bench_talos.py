#!/usr/bin/env python3
"""Benchmark the Talos client against one simulated node on loopback (real mutual TLS).

    .venv/bin/python scripts/bench_talos.py [--dials 50] [--calls 500] [--handshakes 200] [--concurrency 16]
                                            [--smoke]

Figures: dial + Version latency (fresh client: certificate minted, TLS handshake, one RPC),
Version calls per second on a cached channel (sequential and concurrent), TLS handshakes per second
(client context reused), and the cost of minting one client certificate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import benchkit

from ichord.contract import V1_14
from ichord.pki.bundle import generate_bundle
from ichord.sim.talos.build import node_specs
from ichord.sim.talos.cluster import SimCluster
from ichord.sim.talos.testing import fast_timings
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

SMOKE = {"dials": 5, "calls": 40, "handshakes": 10, "concurrency": 4}


def _ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median_ms": round(statistics.median(values) * 1000, 2),
            "p95_ms": round(values[int(len(values) * 0.95) - 1] * 1000, 2),
            "min_ms": round(values[0] * 1000, 2)}


async def bench(dials: int, calls: int, handshakes: int, concurrency: int) -> dict[str, object]:
    bundle = generate_bundle()
    dial = DialBundle.from_bundle(bundle)
    cluster = SimCluster(V1_14, fast_timings())
    await cluster.start(node_specs(bundle, V1_14, 1, 0, first=201))
    node = cluster.nodes["cp-1"]
    out: dict[str, object] = {}
    try:
        t = time.perf_counter()
        for _ in range(20):
            dial.client_certificate()
        out["mint_client_cert_ms"] = round((time.perf_counter() - t) / 20 * 1000, 3)

        latencies = []
        for _ in range(dials):
            t = time.perf_counter()
            async with TalosClient(dial) as c:
                await c.version(node.endpoint)
            latencies.append(time.perf_counter() - t)
        out["dial_plus_version"] = _ms(latencies)

        async with TalosClient(dial) as c:
            await c.version(node.endpoint)
            t = time.perf_counter()
            for _ in range(calls):
                await c.version(node.endpoint)
            out["version_per_s_sequential"] = round(calls / (time.perf_counter() - t), 1)

            async def worker(n: int) -> None:
                for _ in range(n):
                    await c.version(node.endpoint)

            t = time.perf_counter()
            await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
            done = calls // concurrency * concurrency
            out[f"version_per_s_concurrent_{concurrency}"] = round(done / (time.perf_counter() - t), 1)

        ctx = dial.ssl_context()
        t = time.perf_counter()
        for _ in range(handshakes):
            _reader, writer = await asyncio.open_connection(node.ip, node.port, ssl=ctx, server_hostname=node.ip)
            writer.close()
            await writer.wait_closed()
        out["tls_handshakes_per_s"] = round(handshakes / (time.perf_counter() - t), 1)
        out["handshakes_refused"] = len(cluster.history.of("handshake_refused"))
    finally:
        await cluster.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dials", type=int, default=50)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--handshakes", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    args = benchkit.parse_args(parser, SMOKE)
    result = asyncio.run(bench(args.dials, args.calls, args.handshakes, args.concurrency))
    print(json.dumps(result, indent=2))
    benchkit.require(result, ("mint_client_cert_ms", "dial_plus_version.median_ms", "dial_plus_version.p95_ms",
                              "version_per_s_sequential", f"version_per_s_concurrent_{args.concurrency}",
                              "tls_handshakes_per_s"), equal={"handshakes_refused": 0})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
