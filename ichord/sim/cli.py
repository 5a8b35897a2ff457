"""`ichord sim`: a whole simulated cluster (Talos nodes + their Kubernetes API + ichord's objects).

Plain ``ichord sim [options]`` runs the combined environment until SIGTERM/SIGINT (exit 0), printing
one JSON line per thing to find; ``ichord sim kube`` and ``ichord sim talos`` stay the single
simulators. Whichever module registers first creates ``sim``; this one makes its subcommand optional.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ichord import cliargs
from ichord.contract import parse_contract
from ichord.errors import IchordError
from ichord.pki.bundle import SecretsBundle
from ichord.safefile import check_destination


def sim_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The ``sim`` command, created by whichever of `sim`, `sim kube`, `sim talos` registers first."""
    sim: argparse.ArgumentParser | None = subparsers.choices.get("sim")
    if sim is None:
        sim = subparsers.add_parser("sim", help="run simulators of Talos nodes and of the Kubernetes API")
    return sim


def sim_subparsers(subparsers: Any) -> Any:
    """The ``sim`` command's own subcommands (``kube``, ``talos``); optional, since plain ``sim`` runs both."""
    sim = sim_parser(subparsers)
    for action in sim._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return sim.add_subparsers(dest="simulator", required=False, metavar="SIMULATOR")


def register(subparsers: Any) -> None:
    p = sim_parser(subparsers)
    sim_subparsers(subparsers)
    p.description = ("Without a SIMULATOR: start a simulated Talos cluster and its own Kubernetes API server, "
                     "create the bundle Secret, the TalosCluster and the TalosMachines, write a kubeconfig, "
                     "print one JSON line per endpoint and run until interrupted.")
    p.add_argument("--control-planes", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--talos-version", default="v1.14", help="v1.13 or v1.14 (behaviour and rendered contract)")
    p.add_argument("--bundle", type=Path, help="secrets bundle (secrets.yaml); default: a new one")
    p.add_argument("-n", "--namespace", default="ichord-system",
                   help="namespace of the TalosCluster, its TalosMachines, the bundle Secret and ichord's Leases "
                        "(default %(default)s)")
    p.add_argument("--cluster-name", default="demo", help="the TalosCluster's name")
    p.add_argument("--management-api", choices=("self", "separate"), default="self",
                   help="self: ichord's objects on the managed cluster's API; separate: a second API server")
    p.add_argument("--kubeconfig", type=Path, default=Path("ichord-sim.kubeconfig"),
                   help="where to write ichord's kubeconfig (default %(default)s); an existing file is refused "
                        "unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing --kubeconfig file")
    p.add_argument("--ip-prefix", default="127.0.0.", help="loopback block of the nodes (default %(default)s)")
    p.add_argument("--first-address", type=int, default=11, help="last octet of the first node's address")
    p.add_argument("--talos-port", type=cliargs.port, default=50000,
                   help="apid port on every address (0: any free port)")
    p.add_argument("--api-port", type=cliargs.port, default=6443, help="Kubernetes API port (0: any free port)")
    p.add_argument("--state-port", type=cliargs.port, default=0,
                   help="serve the state/history JSON here (0: any free port)")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated delay by this")
    p.add_argument("--cni", choices=("flannel", "cilium", "unmanaged"), default="flannel",
                   help="the TalosCluster's CNI preset (and the CNI workload --addons runs)")
    p.add_argument("--addons", action="store_true",
                   help="run the CNI, kube-proxy and CoreDNS in kube-system, with the in-cluster client model "
                        "(x509 failures, cilium taints, DNS outages in the state JSON)")
    p.add_argument("--pod-start-delay", type=float, default=None, help="seconds a pod takes to become Ready")
    p.add_argument("--kubelet-restart-lag", type=float, default=None,
                   help="seconds a Kubernetes CA change takes to restart the kubelet (the Node reads Ready meanwhile)")
    p.add_argument("--reboot-time", type=float, default=None,
                   help="seconds a node is away for a reboot, before --time-scale (default 2; the etcd roll's)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.control_planes < 1 or args.workers < 0:
        raise IchordError("--control-planes must be at least 1 and --workers at least 0")
    if not (args.ip_prefix.startswith("127.") and args.ip_prefix.endswith(".") and args.ip_prefix.count(".") == 3):
        raise IchordError(f"--ip-prefix {args.ip_prefix!r} is not a loopback block like 127.0.0.")
    if args.time_scale <= 0:
        raise IchordError("--time-scale must be positive")
    bundle = SecretsBundle.load(args.bundle) if args.bundle else None
    check_destination(args.kubeconfig, force=args.force)  # before anything starts
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args, bundle))
    return 0


async def _serve(args: argparse.Namespace, bundle: SecretsBundle | None) -> None:
    from ichord.sim.combined import SimEnvironment  # noqa: PLC0415 - keep `ichord --help` light
    from ichord.sim.talos.run import scaled  # noqa: PLC0415

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    env = SimEnvironment(
        control_planes=args.control_planes, workers=args.workers, contract=parse_contract(args.talos_version),
        bundle=bundle, namespace=args.namespace, cluster_name=args.cluster_name, time_scale=args.time_scale,
        management_api=args.management_api, ip_prefix=args.ip_prefix, first=args.first_address,
        talos_port=args.talos_port, api_port=args.api_port, state_port=args.state_port,
        kubeconfig=args.kubeconfig.resolve(), replace_kubeconfig=args.force, cni=args.cni, addons=args.addons,
        pod_start_delay=args.pod_start_delay, kubelet_restart_lag=args.kubelet_restart_lag,
        timings=None if args.reboot_time is None else replace(scaled(args.time_scale),
                                                              reboot=args.reboot_time * args.time_scale))
    async with env:
        for line in env.summary():
            print(json.dumps(line), flush=True)
        print(f"ready in {env.started_in:.2f}s; `ichord run --kubeconfig {env.kubeconfig}` runs the daemon against it",
              file=sys.stderr, flush=True)
        await stop.wait()
    print("stopped", file=sys.stderr, flush=True)
