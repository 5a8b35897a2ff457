"""``ichord cluster rehearse NAME -f OPERATION.yaml``: the command line of ichord.rehearsal."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ichord import log, operation_cli, yamlio
from ichord.errors import IchordError
from ichord.kube.client import from_kubeconfig
from ichord.rehearsal.model import KINDS, Durations

if TYPE_CHECKING:
    from ichord.rehearsal.report import Report


class RehearsalFileError(IchordError):
    """The operation file or an option cannot be used (exit 2); nothing was read from the cluster."""


def register(sub: Any, cluster_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "rehearse",
        help="play an operation on a twin of the live cluster: timeline, predicted duration, where it would stop",
        description=(
            "Read the TalosCluster, its TalosMachines, the bundle (in memory only), each node's Talos version, "
            "running configuration and etcd membership, and the managed cluster's Nodes, PodDisruptionBudgets and "
            "workloads; start ichord's simulators seeded with them and run the operation of OPERATION.yaml on them "
            "through the daemon's own steps, time compressed. Prints the timeline (stages, applies, reboots, "
            "kube-apiserver restarts, drains, where a person acts), the predicted duration as a range, and every "
            "stop the real run would hit. Writes nothing to the management API, the managed cluster or any node. "
            "Exit 0: the operation completes; 1: it would stop (or the live cluster could not be read); "
            "2: bad input."),
    )
    cluster_args(p)
    p.add_argument("-f", "--file", dest="file", type=Path, required=True, metavar="OPERATION.yaml",
                   help="the TalosOperation to rehearse (as you would kubectl create it; '-' reads stdin)")
    p.add_argument("--duration", action="append", default=[], metavar="KIND=SECONDS|KIND=LOW-HIGH",
                   help=f"a step's duration on this cluster, replacing the default; KIND one of {', '.join(KINDS)} "
                        "(repeatable)")
    p.add_argument("--budget", type=float, default=240.0, metavar="SECONDS",
                   help="how long the rehearsal itself may run (default 240)")
    p.add_argument("--log-level", type=operation_cli.log_level, default="warning",
                   help="the twin's daemon log on stderr (default %(default)s: what went wrong only)")
    operation_cli.add_output_format(p)
    p.set_defaults(func=_main)


def _read(path: Path) -> Any:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise RehearsalFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        docs = [d for d in yamlio.load_all(text) if d is not None]
    except Exception as exc:
        raise RehearsalFileError(f"{path} is not YAML: {' '.join(str(exc).split())}") from None
    if len(docs) != 1:
        raise RehearsalFileError(f"{path} holds {len(docs)} documents; give one TalosOperation")
    return docs[0]


def add_rehearse_flags(p: argparse.ArgumentParser) -> None:
    """``--rehearse`` (and its ``--duration``) on a command that creates an operation: rehearse it instead."""
    p.add_argument("--rehearse", action="store_true",
                   help="create nothing: play the operation on a twin of the live cluster and print its timeline, "
                        "predicted duration and stops (as `ichord cluster rehearse`; exit 0 completes, 1 would stop)")
    p.add_argument("--duration", action="append", default=[], metavar="KIND=SECONDS|KIND=LOW-HIGH",
                   help=f"with --rehearse: a step's duration on this cluster; KIND one of {', '.join(KINDS)}")


def rehearse_object(args: argparse.Namespace, doc: Any) -> int:
    """Rehearse ``doc`` (a TalosOperation) for a command's ``args`` (NAME, -n, kubeconfig, -o); its exit code."""
    durations = Durations.parse(args.duration)  # a DurationError is an IchordError: exit 2, said by ichord.cli
    log.configure(getattr(args, "log_level", "warning"), json=False, stream=sys.stderr)  # stdout: the report alone
    report = asyncio.run(_run(args, doc, durations))
    if args.output == "text":
        print(report.text(), end="")
    else:
        print(operation_cli.dump(report.as_data(), args.output), end="")
    return report.exit_code


def _main(args: argparse.Namespace) -> int:
    Durations.parse(args.duration)  # refused before anything is read
    if not (math.isfinite(args.budget) and args.budget > 0):  # argparse's float() takes nan and inf
        raise RehearsalFileError("--budget must be a positive number of seconds")
    return rehearse_object(args, _read(args.file))


async def _run(args: argparse.Namespace, doc: Any, durations: Durations) -> Report:
    from ichord.rehearsal.play import rehearse  # noqa: PLC0415 - the simulators and the actor: keeps --help light

    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await rehearse(kube, args.namespace or kube.namespace, args.name, doc, durations,
                              budget=getattr(args, "budget", 240.0))
