"""``ichord cluster config-apply NAME``: create the ``config`` TalosOperation and print its plan
(docs/decisions.md#config-rollout).

Refusals come first and write nothing (operation_cli: the cluster exists, no other operation of it is
unfinished, a machine waits). Plan only unless ``--start`` (``spec.paused: true``): the daemon writes
``status.plan`` (the machines that wait, what for, the order) and nothing runs until ``spec.paused`` is set
to false. ``kubectl create -f`` of the same object does exactly the same. The command writes one new object
and no spec of anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

from ichord import operation_cli
from ichord.api import names
from ichord.api.conditions import find
from ichord.api.max_unavailable import MaxUnavailable, MaxUnavailableError
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.operations.config.plan import Candidate, plan_machines
from ichord.rehearsal import cli as rehearsal_cli

Obj = dict[str, Any]


def register(sub: Any, cluster_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "config-apply",
        help="roll out the changes that wait for a reboot or an API server restart (a config TalosOperation)",
        description=(
            "Create a TalosOperation of kind config for the cluster and print its plan: the machines whose "
            "configuration waits for a reboot (or, on control planes, a kube-apiserver restart), the fields, and "
            "the order (control planes one at a time, then workers, ichord's own node last). Without --start the "
            "operation is created paused: nothing runs until spec.paused is set to false. Refused, with nothing "
            "created (exit 2), when the cluster does not exist, another operation of it is unfinished (a CA "
            "rotation included), or no machine waits."),
    )
    cluster_args(p)
    p.add_argument("--max-unavailable", default=None, metavar="N|N%",
                   help="workers changed at once: a whole number of at least 1 or a percentage of the cluster's "
                   "workers (rounded down, at least 1); default: the TalosCluster's spec.maxUnavailable, else the "
                   "daemon's --max-unavailable (25%%)")
    p.add_argument("--start", action="store_true", help="start at once instead of creating a plan only")
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the daemon to write the plan (default 60)")
    rehearsal_cli.add_rehearse_flags(p)
    operation_cli.add_output_format(p)
    p.set_defaults(func=_main)


def operation_object(cluster: str, name: str, *, max_unavailable: MaxUnavailable | None, start: bool) -> Obj:
    """The operation; without ``max_unavailable`` the spec leaves it to the cluster's or the daemon's value."""
    spec: Obj = {"clusterRef": {"name": cluster}, "kind": names.KIND_CONFIG, "paused": not start}
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable.to_api()
    return {"apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION, "metadata": {"name": name}, "spec": spec}


def format_plan(op: Obj, flags: str = "") -> str:
    """The plan as a table, then its warnings and what to run next (``flags``: the user's kubeconfig flags)."""
    status = op.get("status") or {}
    meta = op.get("metadata") or {}
    lines = [f"TalosOperation {meta.get('namespace', '')}/{meta['name']}: {status.get('phase', 'Pending')} - "
             f"{status.get('message', '')}".rstrip(" -")]
    plan = status.get("plan") or {}
    rows = [("ORDER", "MACHINE", "ROLE", "CHANGE", "FIELDS")]
    for m in plan.get("machines") or []:
        paths = list(m.get("paths") or [])
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        rows.append((str(m.get("order", "")), str(m["name"]), str(m.get("role", "")),
                     str(m.get("change") or ("Reboot" if m.get("reboots") else "")), shown))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    for w in plan.get("warnings") or []:
        lines.append(f"note: {w}")
    if plan.get("kubernetesAPIUnavailable"):
        lines.append("note: the cluster has one control plane: the Kubernetes API is unavailable while it changes")
    hint = operation_cli.start_hint(op, flags)
    if hint:
        lines.append(hint)
    return "\n".join(lines) + "\n"


async def config_apply(kube: KubeClient, cluster: str, namespace: str, *, max_unavailable: MaxUnavailable | None = None,
                       start: bool = False, wait: float = 60.0, now: dt.datetime | None = None) -> Obj:
    """Refuse what the daemon would refuse (nothing written), else create the operation and wait (up to ``wait``
    s) for the daemon's plan; the object as read. Raises operation_cli.Refused."""
    in_use = operation_cli.bundle_in_use_refusal(await operation_cli.read_cluster(kube, namespace, cluster))
    if in_use:
        raise operation_cli.Refused(in_use)
    busy = await operation_cli.unfinished_refusal(kube, namespace, cluster)
    if busy:
        raise operation_cli.Refused(busy)
    machines = await operation_cli.approved_machines(kube, namespace, cluster)
    refusing = _refusing_the_bundle(machines)
    if refusing:
        raise operation_cli.Refused(
            f"the bundle of cluster {namespace}/{cluster} is not the one its nodes trust (TalosMachine "
            f"{', '.join(refusing)} Ready BundleMismatch: another cluster's CAs in the bundle Secret): rolling it out "
            f"would hand the nodes CAs they do not trust. Put the cluster's own bundle back (the TalosCluster's Ready "
            f"says how: `kubectl -n {namespace} get tc {cluster} -o yaml`). Nothing was created.")
    if not plan_machines([Candidate.of(o) for o in machines]):
        raise operation_cli.Refused(
            f"no machine of cluster {namespace}/{cluster} waits for a reboot or an API server restart (no approved "
            "TalosMachine reports status.rebootPaths, nor a control plane status.apiServerRestartPaths); nothing to "
            "roll out. Nothing was created.")
    name = operation_cli.operation_name(cluster, "config", now)
    body = operation_object(cluster, name, max_unavailable=max_unavailable, start=start)
    return await operation_cli.create_and_plan(kube, namespace, body, wait=wait)


def _refusing_the_bundle(machines: list[Obj]) -> list[str]:
    """The approved machines whose Ready says their node does not trust the bundle
    (docs/decisions.md#bundle-belongs)."""
    return [str(o["metadata"]["name"]) for o in machines
            if (find((o.get("status") or {}).get("conditions"), names.READY) or {}).get("reason")
            == names.ReadyReason.BUNDLE_MISMATCH]


def _main(args: argparse.Namespace) -> int:
    try:
        bound = None if args.max_unavailable is None else MaxUnavailable.parse_text(args.max_unavailable)
    except MaxUnavailableError as exc:
        raise operation_cli.Refused(f"{exc}. Nothing was created.") from None
    if args.wait < 0:
        raise operation_cli.Refused("--wait must be 0 or more seconds. Nothing was created.")
    if args.rehearse:
        return rehearsal_cli.rehearse_object(args, operation_object(
            args.name, operation_cli.operation_name(args.name, "config"), max_unavailable=bound, start=True))
    op = asyncio.run(_cli(args, bound))
    operation_cli.print_operation(op, args.output, lambda o: format_plan(o, operation_cli.kube_flags(args)))
    note = operation_cli.waiting_note(op, args.wait)
    if note and args.output == "text":
        print(f"note: {note}")
    return 0


async def _cli(args: argparse.Namespace, max_unavailable: MaxUnavailable | None) -> Obj:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await config_apply(kube, args.name, args.namespace or kube.namespace,
                                  max_unavailable=max_unavailable, start=args.start, wait=args.wait)
