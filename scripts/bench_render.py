#!/usr/bin/env python3
"""Render throughput and bundle-generation cost.

Prints one machine-readable line per figure:
    bench_render contract=v1.14 role=controlplane patches=1 renders_per_s=...
    bench_generate_bundle contract=v1.14 runs=N mean_ms=... min_ms=... max_ms=...
Usage: .venv/bin/python scripts/bench_render.py [--seconds 1.0] [--bundles 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import time

import benchkit

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs

PATCH = """machine:
  network:
    hostname: bench
  kubelet:
    extraArgs:
      rotate-server-certificates: "true"
---
apiVersion: v1alpha1
kind: KernelModuleConfig
name: br_netfilter
"""
#: Talos 1.13 has no KernelModuleConfig document (its decoder refuses the kind): the v1alpha1 field there.
PATCH_V1_13 = """machine:
  network:
    hostname: bench
  kubelet:
    extraArgs:
      rotate-server-certificates: "true"
  kernel:
    modules:
      - name: br_netfilter
"""
SMOKE = {"seconds": 0.05, "bundles": 1}


def bench_render(bundle: SecretsBundle, contract: VersionContract, role: str, patched: bool, seconds: float) -> float:
    cluster = ClusterInputs(
        cluster_name="bench", endpoint="https://bench.example:6443", kubernetes_version="1.34.1",
        contract=contract, additional_sans=("bench.example",),
        patches=((PATCH if contract.multidoc_kubernetes else PATCH_V1_13),) if patched else (),
    )
    machine = MachineInputs(role="controlplane" if role == "controlplane" else "worker")
    render(bundle, cluster, machine)  # warm-up
    n = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        render(bundle, cluster, machine)
        n += 1
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per render figure")
    parser.add_argument("--bundles", type=int, default=5, help="bundles to generate per contract")
    args = benchkit.parse_args(parser, SMOKE)

    figures: dict[str, float] = {}
    bundle = generate_bundle(V1_14)
    for contract in (V1_13, V1_14):
        for role in ("controlplane", "worker"):
            for patched in (False, True):
                rate = bench_render(bundle, contract, role, patched, args.seconds)
                figures[f"render {contract} {role} patches={int(patched)}"] = rate
                print(f"bench_render contract={contract} role={role} patches={int(patched)} "
                      f"renders_per_s={rate:.1f}", flush=True)
    for contract in (V1_14, VersionContract(1, 6)):
        times = []
        for _ in range(args.bundles):
            start = time.perf_counter()
            generate_bundle(contract)
            times.append((time.perf_counter() - start) * 1000)
        sa = "rsa4096" if contract > VersionContract(1, 6) else "ecdsa-p256"
        figures[f"generate_bundle {contract}"] = statistics.mean(times) if times else 0.0
        print(f"bench_generate_bundle contract={contract} service_account_key={sa} runs={len(times)} "
              f"mean_ms={statistics.mean(times):.1f} min_ms={min(times):.1f} max_ms={max(times):.1f}", flush=True)
    benchkit.require(figures, figures)


if __name__ == "__main__":
    main()
