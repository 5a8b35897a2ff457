"""`ichord sim talos`: start simulated Talos nodes running the configurations ichord renders."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from ichord import cliargs
from ichord.contract import parse_contract
from ichord.errors import IchordError
from ichord.pki.bundle import SecretsBundle
from ichord.sim.cli import sim_subparsers


def register(subparsers: Any) -> None:
    p = sim_subparsers(subparsers).add_parser(
        "talos", help="simulated Talos nodes (real gRPC over mutual TLS) on loopback addresses",
        description="Start N control planes and M workers, each on its own 127.0.0.x address, running the "
                    "configuration `ichord render` produces for it. Prints one JSON line per node.")
    p.add_argument("--bundle", required=True, help="secrets bundle (secrets.yaml)")
    p.add_argument("--control-planes", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--talos-version", default="v1.14", help="v1.13 or v1.14 (behaviour and rendered contract)")
    p.add_argument("--port", type=cliargs.port, default=50000, help="apid port on every address (0: any free port)")
    p.add_argument("--first-address", type=int, default=11, help="last octet of the first node's 127.0.0.x")
    p.add_argument("--state-port", type=cliargs.port, default=None, help="serve the state and history as JSON here")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every simulated delay (reboot, kubelet restart, ...) by this")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ichord.sim.talos.run import SimOptions, serve  # noqa: PLC0415 - keep `ichord --help` light

    if args.control_planes < 1 or args.workers < 0 or args.control_planes + args.workers > 200:
        raise IchordError("--control-planes must be at least 1 and --workers at least 0 (200 nodes at most)")
    opts = SimOptions(bundle=SecretsBundle.load(args.bundle), contract=parse_contract(args.talos_version),
                      control_planes=args.control_planes, workers=args.workers, port=args.port,
                      first=args.first_address, state_port=args.state_port, time_scale=args.time_scale)
    return asyncio.run(serve(opts))
