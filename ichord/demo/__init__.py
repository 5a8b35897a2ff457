"""``ichord demo``: the daemon (``ichord run``) against a whole simulated cluster, in one process.

The simulators (Kubernetes API + Talos nodes, ``ichord sim``'s environment) and the daemon share one
event loop; the demo watches both from the inside (the API server's store and the Talos nodes'
history, so watching costs no API request) while it drives the cluster through the Kubernetes API
like an operator would: converge, a safe patch (one apply per node), a reboot-requiring patch
(reported, never applied), its removal; then a default CA rotation, the demo playing the operator
for the hand-off. With a terminal a live table, otherwise one plain line per transition. Exit 0
when every step did what it shows, 1 with the reason otherwise.

    observe.py   what is seen: the machines (store listener, Talos history)
    view.py      how it is shown: plain lines in a pipe, a live table on a terminal
    script.py    the demo: simulators, daemon, the configuration steps, the summary
    rotation.py  the CA rotation step and the simulator's truth at its end
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio

from ichord import operation_cli
from ichord.contract import parse_contract
from ichord.demo.observe import DemoFailed, Observer, Row, _expect_applies
from ichord.demo.view import Lines, LiveTable, View
from ichord.errors import IchordError
from ichord.pki.bundle import SecretsBundle

__all__ = ["DemoArgumentError", "DemoFailed", "Lines", "LiveTable", "Observer", "Row", "View", "_expect_applies",
           "register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="run the daemon against a simulated cluster and show what it does",
        description="Start a simulated Talos cluster and its Kubernetes API, run the daemon against it in this "
        "process, and show machines converging, a safe patch applied once per node, a reboot-requiring "
        "patch reported and never applied, and a CA rotation of the talos and kubernetes CAs. Exit 0 when all "
        "of it happened.")
    p.add_argument("--control-planes", type=int, default=3)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--talos-version", default="v1.14", help="v1.13 or v1.14 (default %(default)s)")
    p.add_argument("--only", choices=("all", "config", "rotation"), default="all",
                   help="config: the configuration steps; rotation: converge, then the CA rotation "
                   "(default %(default)s)")
    # Not much lower: the simulators share the daemon's event loop, and on a busy machine a shorter
    # lease renewal deadline (9 s here) makes the daemon step down (LeadershipLost) mid-demo.
    p.add_argument("--time-scale", type=float, default=0.1,
                   help="multiply every duration, the daemon's and the simulated ones, by this (default %(default)g: "
                   "the 120 s leader lease lasts 12 s)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds each step may take (default %(default)g)")
    p.add_argument("--bundle", type=Path, help="secrets bundle to use (default: a new one, in memory)")
    p.add_argument("--workdir", type=Path, help="where the daemon's log and the operator's credentials go (default: "
                   "a new temporary directory)")
    p.add_argument("--log-level", type=operation_cli.log_level, default="info",
                   help="the daemon's log level (default %(default)s)")
    p.set_defaults(func=run)


class DemoArgumentError(IchordError):
    """A demo option is out of range."""


def run(args: argparse.Namespace) -> int:
    if args.control_planes < 1 or args.workers < 0:
        raise DemoArgumentError("--control-planes must be at least 1 and --workers at least 0")
    if args.control_planes % 2 == 0 and args.only != "config":
        raise DemoArgumentError(
            f"--control-planes {args.control_planes}: the demo's CA rotation needs an odd number of control planes "
            "(1, 3, 5, ...): ichord refuses to restart etcd members of an even-sized cluster (its quorum would not "
            "survive one member's restart); pass an odd number, or --only config")
    if args.time_scale <= 0 or args.timeout <= 0:
        raise DemoArgumentError("--time-scale and --timeout must be positive")
    contract = parse_contract(args.talos_version)
    bundle = SecretsBundle.load(args.bundle) if args.bundle else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ichord-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    view: View = LiveTable(sys.stdout) if sys.stdout.isatty() else Lines(sys.stdout)
    from ichord.demo.script import Demo  # noqa: PLC0415 - keeps `ichord --help` light

    demo = Demo(args, contract, bundle, workdir / "daemon.log", view)
    return anyio.run(demo.main, backend="asyncio")
