"""Creating a TalosOperation from the command line: ``ichord cluster config-apply`` and ``ichord cluster rotate``.

Both commands have one shape (docs/decisions.md#cli-contract): check what the daemon would refuse before
writing anything (the cluster exists, no other operation of it is unfinished, there is something to do, the
cluster's contract supports the targets), create one operation (paused unless ``--start``), wait up to
``--wait`` seconds for the daemon's plan and print it (``-o json|yaml``: the object as read). When the daemon
refuses it all the same (another operation was created in between), the command deletes the object it
created, by UID, and exits 2: a refusal leaves nothing behind.

Exit codes, as every ichord command: 0 the operation exists (planned, or still waiting for the daemon),
1 a runtime failure (the API server did not answer), 2 refused, nothing created.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from ichord import yamlio
from ichord.api import names
from ichord.api.conditions import find
from ichord.api.max_unavailable import MaxUnavailable, MaxUnavailableError
from ichord.api.views import ClusterView, MachineView, OperationView, operations_of
from ichord.contract import UnsupportedContractError, parse_contract
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import AlreadyExists, KubeError, NotFound
from ichord.operations.ca_rotation.plan import (
    TargetSpecError,
    UnsupportedTargetError,
    contract_refusal,
    spec_targets,
)
from ichord.pki.rotation import RotationError, parse_targets
from ichord.pki.targets import default_target_names, target_names
from ichord.rehearsal import cli as rehearsal_cli

Obj = dict[str, Any]

#: ``-o``: how a command that prints state prints it (text is the table; json and yaml the objects as read).
OUTPUT_FORMATS = ("text", "json", "yaml")


class Refused(IchordError):
    """The command was refused and nothing was written; the message says why and what to do (exit 2)."""


class DeprecatedAlias(argparse.Action):
    """An old spelling still accepted (``-o FILE`` where ``-o`` now means the output format elsewhere): it sets
    the same value and says once, on stderr, what to use instead."""

    def __init__(self, option_strings: list[str], dest: str, instead: str = "", **kwargs: Any) -> None:
        self.instead = instead
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"note: {option_string} is deprecated here; use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, values)


#: Kubernetes object names (RFC 1123 subdomain, at most 253) and namespaces (RFC 1123 label, at most 63).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def object_name(text: str) -> str:
    """argparse ``type=`` for an object's NAME: an empty or non-DNS-1123 name is bad input (exit 2)."""
    if len(text) > 253 or not _DNS_SUBDOMAIN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Kubernetes object name (lower-case letters, digits, '-' and '.', starting and "
            "ending with a letter or digit, at most 253 characters)")
    return text


def namespace_name(text: str) -> str:
    """argparse ``type=`` for a namespace: an empty or non-DNS-1123-label name is bad input (exit 2)."""
    if len(text) > 63 or not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a namespace name (lower-case letters, digits and '-', starting and ending with a "
            "letter or digit, at most 63 characters)")
    return text


#: The log levels ``--log-level`` takes (the standard library's, any case).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level(text: str) -> str:
    """argparse ``type=`` for ``--log-level``: a level logging does not know is bad input (exit 2)."""
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level; one of {', '.join(LOG_LEVELS)}")
    return text.lower()


def add_output_format(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="text",
                   help="text (default), or json / yaml: the objects as read, for scripts")


def dump(data: Any, fmt: str) -> str:
    """``data`` as JSON (indented, one trailing newline) or YAML."""
    if fmt == "json":
        return json.dumps(data, indent=2, sort_keys=False) + "\n"
    return yamlio.dump(data)


def kube_flags(args: argparse.Namespace) -> str:
    """The kubeconfig flags the user passed, for a command a message names (it must work pasted as printed)."""
    out = ""
    if getattr(args, "kubeconfig", None):
        out += f" --kubeconfig {args.kubeconfig}"
    if getattr(args, "context", None):
        out += f" --context {args.context}"
    return out


async def read_cluster(kube: KubeClient, namespace: str, name: str) -> Obj:
    """The TalosCluster an operation is for; Refused when it does not exist or is being deleted (an operation of
    a cluster on its way out would run against machines being let go)."""
    try:
        obj = await crds.clusters(kube).get(namespace, name)
    except NotFound:
        raise Refused(f"TalosCluster {namespace}/{name} not found; check the name and -n. Nothing was created.") \
            from None
    if ClusterView.of(obj).deleting:
        held = ", ".join(str(f) for f in (obj.get("metadata") or {}).get("finalizers") or []) or "none"
        raise Refused(f"TalosCluster {namespace}/{name} is being deleted (deletionTimestamp set; finalizers: "
                      f"{held}); no operation is started on a cluster on its way out. Nothing was created.")
    return obj


def bundle_in_use_refusal(obj: Obj) -> str | None:
    """Why no operation may be created for the cluster ``obj`` (as read) because another TalosCluster holds its bundle
    Secret, or None: the daemon holds every operation of it (Ready=False/BundleInUse, docs/decisions.md#one-owner)."""
    ready = find((obj.get("status") or {}).get("conditions"), names.READY)
    if ready is None or ready.get("reason") != names.ReadyReason.BUNDLE_IN_USE:
        return None
    view = ClusterView.of(obj)
    return f"TalosCluster {view.key} runs no operation: {ready.get('message', '')}. Nothing was created."


async def unfinished_refusal(kube: KubeClient, namespace: str, cluster: str) -> str | None:
    """Why no operation may be created for the cluster now (another one is unfinished), or None.

    The daemon refuses the same (config: ClusterCARotating/OperationUnfinished; a second rotation waits on the
    cluster lock): refusing here writes nothing at all."""
    objs, _ = await crds.operations(kube).list_objects(namespace)
    for other in operations_of(objs, namespace, cluster):
        if other.finished:
            continue
        what = other.description.title if other.description is not None else f"a {other.kind} operation"
        state = other.phase or "Pending"
        if other.stage:
            state += f", stage {other.stage}"
        text = (f"{what}, TalosOperation {namespace}/{other.name} ({state}), of cluster {namespace}/{cluster} is "
                f"unfinished; run this again once it completed (`ichord cluster status {cluster} -n {namespace}` "
                "shows it and its next step)")
        if not other.stage and not other.deleting:
            # Not started (a plan, or held in its preflight): giving way costs nothing, and it may be waiting for
            # the very change this command rolls out.
            text += (f", or, to run this first, delete it (`kubectl -n {namespace} delete talosoperation "
                     f"{other.name}`; it has not started, nothing is undone) and create it again afterwards")
        return text + ". Nothing was created."
    return None


async def approved_machines(kube: KubeClient, namespace: str, cluster: str) -> list[Obj]:
    objs, _ = await crds.machines(kube).list_objects(namespace)
    out = []
    for obj in objs:
        try:
            view = MachineView.of(obj)
        except IchordError:
            continue  # a malformed machine is the reconciler's to report; it is in no plan
        if view.cluster == cluster and view.approved:
            out.append(obj)
    return out


def operation_name(cluster: str, kind: str, now: dt.datetime | None = None) -> str:
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{cluster}-{kind}-{stamp}"[:63]


#: Reasons the daemon gives when it refuses an operation before it ran anything (its kind's condition).
REFUSAL_REASONS = frozenset({
    "NothingToDo", names.LockRefusal.CLUSTER_CA_ROTATING, "OperationUnfinished",
    names.CARotationReason.UNSUPPORTED_TARGET, names.CARotationReason.INVALID_SPEC,
})


async def create_and_plan(kube: KubeClient, namespace: str, body: Obj, *, wait: float,
                          poll: float = 0.2) -> Obj:
    """Create ``body`` and wait up to ``wait`` s for the daemon's plan (or its refusal); the object as read.

    A refusal the daemon wrote (Failed before any stage ran) is deleted again by UID and raised as Refused."""
    ops = crds.operations(kube)
    base = str(body["metadata"]["name"])
    for attempt in range(2, 12):
        try:
            created = await ops.create(namespace, body)
            break
        except AlreadyExists:  # another command in the same second: the next free suffix
            body = {**body, "metadata": {**body["metadata"], "name": f"{base[:60]}-{attempt}"}}
    else:
        raise Refused(f"TalosOperations {namespace}/{base} and its next ten suffixes exist already; pass again "
                      "in a second. Nothing was created.")
    name, uid = str(created["metadata"]["name"]), str(created["metadata"]["uid"])
    op = created
    with anyio.move_on_after(wait):
        while True:
            op = await ops.get(namespace, name)
            status = op.get("status") or {}
            if status.get("plan") or status.get("phase") in (names.Phase.FAILED, names.Phase.COMPLETED):
                break
            await anyio.sleep(poll)
    view = OperationView.of(op)
    cond = view.condition() or {}
    if view.phase == names.Phase.FAILED and not view.stage and cond.get("reason") in REFUSAL_REASONS:
        try:
            await ops.delete(namespace, name, uid=uid)
        except NotFound:
            pass
        except KubeError as exc:
            raise Refused(f"the daemon refused TalosOperation {namespace}/{name} ({cond.get('reason')}: "
                          f"{cond.get('message', '')}) and it could not be deleted: {exc}; delete it with `kubectl "
                          f"-n {namespace} delete talosoperation {name}`") from None
        raise Refused(f"refused by the daemon ({cond.get('reason')}): {cond.get('message', '')}. "
                      f"TalosOperation {namespace}/{name} was deleted again; nothing is left.")
    return op


def print_operation(op: Obj, fmt: str, text: Callable[[Obj], str]) -> None:
    if fmt == "text":
        print(text(op), end="")
    else:
        print(dump(op, fmt), end="")


def start_hint(op: Obj, flags: str) -> str | None:
    """The command that starts a plan-only operation, as it works pasted."""
    meta = op.get("metadata") or {}
    if (op.get("spec") or {}).get("paused") and (op.get("status") or {}).get("phase", names.Phase.PENDING) in (
            names.Phase.PENDING, names.Phase.PAUSED):
        return (f"plan only; start it with: kubectl{flags} -n {meta.get('namespace', '')} patch talosoperation "
                f"{meta.get('name', '')} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'")
    return None


def waiting_note(op: Obj, wait: float) -> str | None:
    status = op.get("status") or {}
    if not status.get("plan") and not status.get("phase"):
        return (f"the daemon wrote no plan within {wait:g} s (is `ichord run` running and leading?); the operation "
                "exists and will be planned when it does")
    return None


# ---- ichord cluster rotate ------------------------------------------------------------------------


def register_rotate(sub: Any, cluster_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "rotate",
        help="rotate the cluster's CAs (creates a ca-rotation TalosOperation and prints its plan)",
        description=(
            "Create a TalosOperation of kind ca-rotation for the cluster and print its plan: the targets, the stages, "
            "the machines and the warnings. Without --start the operation is created paused: nothing runs until "
            "spec.paused is set to false (the command to do so is printed). Refused, with nothing created, when the "
            "cluster does not exist, another operation of it is unfinished, or its Talos version does not support "
            "a target (kubernetes-aggregator needs v1.14)."),
    )
    cluster_args(p)
    p.add_argument("--targets", default=None, metavar="T[,T...]",
                   help=f"the CAs to rotate, comma-separated: {', '.join(target_names())} "
                        f"(default {','.join(default_target_names())})")
    p.add_argument("--max-unavailable", default=None, metavar="N|N%",
                   help="workers a pass changes at once (default: the TalosCluster's spec.maxUnavailable, else the "
                        "daemon's --max-unavailable)")
    p.add_argument("--start", action="store_true", help="start at once instead of creating a plan only")
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="how long to wait for the daemon to write the plan (default 60)")
    rehearsal_cli.add_rehearse_flags(p)
    add_output_format(p)
    p.set_defaults(func=_rotate_main)


def rotation_object(cluster: str, name: str, *, targets: Sequence[str] | None, max_unavailable: MaxUnavailable | None,
                    start: bool) -> Obj:
    spec: Obj = {"clusterRef": {"name": cluster}, "kind": names.KIND_CA_ROTATION, "paused": not start}
    if targets:
        spec["caRotation"] = {"targets": list(targets)}
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable.to_api()
    return {"apiVersion": names.API_VERSION, "kind": names.TALOS_OPERATION, "metadata": {"name": name}, "spec": spec}


def format_rotation_plan(op: Obj, flags: str = "") -> str:
    status = op.get("status") or {}
    meta = op.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    message = status.get("message") or (OperationView.of(op).condition() or {}).get("message", "")
    lines = [f"TalosOperation {ns}/{name}: {status.get('phase', 'Pending')} - {message}".rstrip(" -")]
    plan = status.get("plan") or {}
    if plan.get("targets"):
        lines.append(f"targets: {', '.join(str(t) for t in plan['targets'])}")
    if plan.get("stages"):
        lines.append(f"stages: {' -> '.join(str(s) for s in plan['stages'])}")
    rows = [("MACHINE", "ROLE", "REBOOTS")]
    for m in plan.get("machines") or []:
        rows.append((str(m.get("name", "")), str(m.get("role", "")), "yes" if m.get("reboots") else "no"))
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for w in plan.get("warnings") or []:
        lines.append(f"note: {w}")
    hint = start_hint(op, flags)
    if hint:
        lines.append(hint)
    return "\n".join(lines) + "\n"


def _rotate_main(args: argparse.Namespace) -> int:
    try:
        targets = None if args.targets is None else [t.strip() for t in str(args.targets).split(",") if t.strip()]
        if targets is not None:
            if not targets:
                raise RotationError("--targets names no target")
            parse_targets(targets)
        bound = None if args.max_unavailable is None else MaxUnavailable.parse_text(args.max_unavailable)
    except (RotationError, MaxUnavailableError) as exc:
        raise Refused(f"{exc}. Nothing was created.") from None
    if args.wait < 0:
        raise Refused("--wait must be 0 or more seconds. Nothing was created.")
    if args.rehearse:
        return rehearsal_cli.rehearse_object(args, rotation_object(
            args.name, operation_name(args.name, "rotation"), targets=targets, max_unavailable=bound, start=True))
    op = anyio.run(_rotate, args, targets, bound, backend="asyncio")
    print_operation(op, args.output, lambda o: format_rotation_plan(o, kube_flags(args)))
    note = waiting_note(op, args.wait)
    if note and args.output == "text":
        print(f"note: {note}")
    return 0


async def _rotate(args: argparse.Namespace, targets: list[str] | None, bound: MaxUnavailable | None) -> Obj:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        namespace = args.namespace or kube.namespace
        return await rotate(kube, args.name, namespace, targets=targets, max_unavailable=bound, start=args.start,
                            wait=args.wait)


async def rotate(kube: KubeClient, cluster: str, namespace: str, *, targets: Sequence[str] | None = None,
                 max_unavailable: MaxUnavailable | None = None, start: bool = False, wait: float = 60.0) -> Obj:
    """The whole ``cluster rotate``: refusals first (nothing written), then create and wait for the plan."""
    obj = await read_cluster(kube, namespace, cluster)
    in_use = bundle_in_use_refusal(obj)
    if in_use:
        raise Refused(in_use)
    body = rotation_object(cluster, operation_name(cluster, "rotation"), targets=targets,
                           max_unavailable=max_unavailable, start=start)
    try:
        chosen = spec_targets(body)
    except (TargetSpecError, UnsupportedTargetError) as exc:
        raise Refused(f"{exc}. Nothing was created.") from None
    talos_version = ClusterView.of(obj).spec.get("talosVersion")
    if talos_version:
        try:
            refusal = contract_refusal(chosen, parse_contract(str(talos_version)))
        except UnsupportedContractError:
            refusal = None  # the daemon reports a cluster whose contract it cannot render
        if refusal:
            raise Refused(f"{refusal}. Nothing was created.")
    busy = await unfinished_refusal(kube, namespace, cluster)
    if busy:
        raise Refused(busy)
    return await create_and_plan(kube, namespace, body, wait=wait)

