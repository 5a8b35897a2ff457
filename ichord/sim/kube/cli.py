"""`ichord sim kube`: serve the Kubernetes API simulator alone and write a kubeconfig for it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
from pathlib import Path
from typing import Any

from ichord import cliargs
from ichord.errors import IchordError
from ichord.safefile import check_destination, write_file
from ichord.sim.cli import sim_subparsers
from ichord.sim.kube.behaviours import BehaviourSettings
from ichord.sim.kube.server import DEFAULT_CRD_DIR, KubeSimulator, SimSettings


def register(subparsers: Any) -> None:
    p = sim_subparsers(subparsers).add_parser(
        "kube", help="a simulated Kubernetes API server (real REST over HTTPS) with ichord's CRDs",
        description="Serve the Kubernetes API simulator on a loopback address until interrupted, write a "
                    "kubeconfig for it (kubectl and ichord run can use it) and print one JSON line.")
    p.add_argument("--host", default="127.0.0.1", help="loopback address to bind (127.0.0.0/8)")
    p.add_argument("--port", type=cliargs.port, default=6443, help="port (0: any free port)")
    p.add_argument("--kubeconfig", type=Path, default=Path("ichord-sim.kubeconfig"),
                   help="kubeconfig to write; an existing file is refused unless --force")
    p.add_argument("--force", action="store_true", help="replace an existing --kubeconfig file")
    p.add_argument("--crds", type=Path, default=DEFAULT_CRD_DIR, help="directory of CRD YAML files to serve")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated delay by this")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not ipaddress.ip_address(args.host).is_loopback:
        raise IchordError(f"--host {args.host} is not a loopback address; the simulator binds 127.0.0.0/8 only")
    if not args.crds.is_dir():
        raise IchordError(f"--crds {args.crds} is not a directory; point it at helm/ichord/files/crds")
    s = args.time_scale
    base = BehaviourSettings()
    behaviours = BehaviourSettings(
        root_ca_publish_lag=base.root_ca_publish_lag * s, projected_ca_lag=base.projected_ca_lag * s,
        rollout_step=base.rollout_step * s, kubelet_restart=base.kubelet_restart * s,
        ext_auth_recreate_lag=base.ext_auth_recreate_lag * s)
    settings = SimSettings(host=args.host, port=args.port, crd_dir=args.crds, behaviours=behaviours)
    kubeconfig = check_destination(args.kubeconfig, force=args.force)  # before anything is served
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(settings, kubeconfig, force=args.force))
    return 0


async def _serve(settings: SimSettings, kubeconfig: Path, *, force: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with KubeSimulator(settings) as sim:
            write_file(kubeconfig, sim.kubeconfig_data(), force=force)
            print(json.dumps({"url": sim.url, "kubeconfig": str(kubeconfig)}), flush=True)
            await stop.wait()
    except OSError as exc:
        raise IchordError(f"cannot serve on {settings.host}:{settings.port}: {exc.strerror}; pick another "
                          f"--port") from None
    print("stopped", file=sys.stderr)
