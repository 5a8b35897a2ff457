"""A process that steps the reboot roll until it is done, as the cluster actor would: ``python -m
tests.chaos._roll_runner --kubeconfig K --namespace N --operation OP --secret S --plan JSON``.

Everything it knows comes from outside the process: the marker from the TalosOperation's status, the Talos
credentials from the bundle Secret, the rest from the nodes and the Nodes. ``ICHORD_FAILPOINTS`` kills it
(exit 137); ``ICHORD_TIME_SCALE`` shrinks the roll's bounds. Prints one JSON line per step; exits 0 when
the roll is done, 3 when it pauses, 4 when it did not finish within ``--steps``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from ichord.api.names import SECRETS_KEY
from ichord.contract import V1_14
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.kube.reads import read_secret
from ichord.operations.outcome import next_delay
from ichord.operations.roll import KubeNodes, RollTarget, TalosNodes, advance_roll
from ichord.operations.roll_store import StatusMarkerStore
from ichord.pki.bundle import SecretsBundle
from ichord.settings import Timing
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

DONE, PAUSED, UNFINISHED = 0, 3, 4


async def run(args: argparse.Namespace) -> int:
    timing = Timing.from_env()
    plan = [RollTarget(**t) for t in json.loads(args.plan)]
    # The roll's bounds are scaled; each API call keeps its normal timeout (a loaded CI is slow, not broken).
    async with await from_kubeconfig(args.kubeconfig, timing=Timing()) as kc:
        secret = await read_secret(kc, args.namespace, args.secret)
        bundle = SecretsBundle.from_yaml(secret.data[SECRETS_KEY])
        store = StatusMarkerStore(crds.operations(kc), args.namespace, args.operation)
        async with TalosClient(DialBundle.from_bundle(bundle), dial_timeout=2, rpc_timeout=5) as talos:
            for _ in range(args.steps):
                try:
                    out = await advance_roll(plan, store, TalosNodes(talos, V1_14), KubeNodes(kc), timing=timing)
                except IchordError as exc:  # the actor logs a failed step and runs it again later
                    print(json.dumps({"error": str(exc)}), flush=True)
                    await asyncio.sleep(timing.retry)
                    continue
                print(json.dumps({"reason": str(out.reason), "machine": out.machine, "pause": out.pause,
                                  "message": out.message}), flush=True)
                if out.finished:
                    return DONE
                if out.pause:
                    return PAUSED
                await asyncio.sleep(next_delay(out.outcome) or 0.0)
    return UNFINISHED


def main() -> int:
    parser = argparse.ArgumentParser(prog="roll-runner")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--operation", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--plan", required=True, help="JSON list of {machine, endpoint, node}")
    parser.add_argument("--steps", type=int, default=2000)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
