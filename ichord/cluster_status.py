"""``ichord cluster status``: what a TalosCluster is doing, and the command the operator runs next.

``read_view`` reads the cluster, its machines and its operations through the Kubernetes client;
``format_status`` is a pure function of those objects and the time, so its output is golden-tested.
Only fingerprints are printed (status never holds key or certificate material; messages are scrubbed
again all the same).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ichord.api import names
from ichord.api.conditions import find, parse_time
from ichord.api.names import CARotationReason, Phase
from ichord.api.views import OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.errors import NotFound
from ichord.pki.scrub import SCRUBBER

Obj = dict[str, Any]

FINISHED = (Phase.COMPLETED, Phase.FAILED)
#: Characters of a sha256 fingerprint shown in tables (the CA section shows them whole).
SHORT_FINGERPRINT = 12


class ClusterNotFound(IchordError):
    """The TalosCluster does not exist in that namespace."""


@dataclass(frozen=True)
class ClusterView:
    """What ``cluster status`` reads: the TalosCluster and the machines and operations naming it."""

    namespace: str
    name: str
    cluster: Obj
    machines: Sequence[Obj]
    operations: Sequence[Obj]
    #: The kubeconfig flags the command was run with (`` --kubeconfig F``), repeated in the commands it names so
    #: they work pasted as printed.
    flags: str = ""

    def as_data(self, now: dt.datetime) -> Obj:
        """What ``-o json|yaml`` prints: the objects as read and the next commands (no key material is in them)."""
        open_ops = [o for o in self.operations if _phase(o) not in FINISHED]
        return {"cluster": self.cluster, "machines": list(self.machines), "operations": list(self.operations),
                "next": {"operations": {_name(o): next_step(o, self.name, self.namespace, self.flags)
                                        for o in sorted(open_ops, key=_created)},
                         "cluster": next_for_cluster(self, open_ops)},
                "readAt": now.strftime("%Y-%m-%dT%H:%M:%SZ")}


async def read_view(kube: KubeClient, namespace: str, name: str, flags: str = "") -> ClusterView:
    try:
        cluster = await crds.clusters(kube).get(namespace, name)
    except NotFound:
        raise ClusterNotFound(f"TalosCluster {namespace}/{name} not found; check the name and -n") from None
    machines, _ = await crds.machines(kube).list_objects(namespace)
    operations, _ = await crds.operations(kube).list_objects(namespace)
    return ClusterView(namespace, name, cluster, [m for m in machines if _cluster_ref(m) == name],
                       [o for o in operations if _cluster_ref(o) == name], flags)


# ---- the pure part ---------------------------------------------------------------------------


def format_status(view: ClusterView, now: dt.datetime) -> str:
    """The report: conditions, CA expiry, machines, open operations with the next command, the last finished."""
    status = view.cluster.get("status") or {}
    open_ops = sorted((o for o in view.operations if _phase(o) not in FINISHED), key=_created)
    finished = sorted((o for o in view.operations if _phase(o) in FINISHED), key=_finished_at)
    # The open operation whose section carries the CAs being rotated, and each machine's state in it.
    rotation = next((o for o in open_ops if _rotates_cas(o)), None)
    out = [f"TalosCluster {view.namespace}/{view.name}"]
    if not status:
        out.append("  no status yet: is the ichord daemon running and electing a leader?")

    out += ["", "Conditions:"]
    out += _table(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"],
                  [[c.get("type", ""), c.get("status", ""), c.get("reason", ""),
                    _age(c.get("lastTransitionTime"), now), _text(c.get("message"))]
                   for c in status.get("conditions") or []], empty="(none)")

    out += ["", "CA certificates:"]
    certs = status.get("certificates") or []
    out += _table(["NAME", "NOT AFTER", "EXPIRES IN", "SHA256 FINGERPRINT"],
                  [[c.get("name", ""), c.get("notAfter", ""), _until(c.get("notAfter"), now),
                    c.get("fingerprint", "")] for c in certs], empty="(not read yet)")
    if rotation is not None:
        out += ["", f"Rotating (TalosOperation {_name(rotation)}):"]
        out += _table(["CA", "PREVIOUS", "NEXT", "SIGNING WITH", "NODES TRUST"],
                      [[c.get("name", ""), _short(c.get("previous")), _short(c.get("next")),
                        _short(c.get("issuing")), " ".join(_short(a) for a in c.get("accepted") or [])]
                       for c in _section(rotation).get("certificates") or []], empty="(no new CAs yet)")

    out += ["", "Machines:"]
    op_machines = {m.get("name"): m for m in (rotation or {}).get("status", {}).get("machines") or []}
    rows = []
    for m in sorted(view.machines, key=_name):
        ready = find((m.get("status") or {}).get("conditions"), names.READY) or {}
        row = [_name(m), (m.get("spec") or {}).get("role", ""), ready.get("status", "Unknown"),
               ready.get("reason", ""), _machine_fingerprints(m, certs)]
        if op_machines:
            entry = op_machines.get(_name(m)) or {}
            row.append(" ".join(x for x in (entry.get("state", ""), _text(entry.get("message"))) if x))
        rows.append(row)
    header = ["NAME", "ROLE", "READY", "REASON", "CA FINGERPRINTS"] + (["ROTATION"] if op_machines else [])
    out += _table(header, rows, empty="(no TalosMachine names this cluster)")

    out += ["", "Operations:"]
    if not open_ops:
        out.append("  none under way")
    for op in open_ops:
        out += _operation(view, op, now)
    if finished:
        last = finished[-1]
        cond = _operation_condition(last)
        when = _age((last.get("status") or {}).get("completedAt") or None, now)
        out.append(f"  last finished: {_name(last)} {_kind(last)} {_phase(last)}"
                   + (f" {when} ago" if when != "-" else "")
                   + (f" ({cond.get('reason')}: {_text(cond.get('message'))})" if cond else ""))

    step = next_for_cluster(view, open_ops)
    if step:
        out += ["", f"Next: {step}"]
    return "\n".join(out) + "\n"


def next_step(op: Obj, cluster: str, namespace: str, flags: str = "") -> str:
    """The command (or the thing to do) that moves an unfinished operation on (``flags``: the kubeconfig flags)."""
    spec, cond = op.get("spec") or {}, _operation_condition(op)
    reason = cond.get("reason", "")
    if reason == CARotationReason.BUNDLE_RESTORE_REQUIRED:  # first: nothing else moves it on (custody.py)
        return f"ichord cluster restore-bundle {cluster} -n {namespace}"
    if spec.get("paused"):
        return (f"kubectl{flags} -n {namespace} patch top {_name(op)} --type merge "
                "-p '{\"spec\":{\"paused\":false}}'")
    view = OperationView.of(op)
    awaits = view.description.awaits_credentials if view.description is not None else None
    if awaits is not None and awaits in (reason, view.stage):
        return f"ichord cluster credentials {cluster} -n {namespace}{flags} --acknowledge"
    if reason == CARotationReason.BLOCKED:
        return "read the message above and fix the cause it names; the daemon retries by itself"
    return "nothing: the daemon is working on it"


def next_for_cluster(view: ClusterView, open_ops: Sequence[Obj]) -> str | None:
    """What the operator should do about the cluster itself once no operation waits on them."""
    if open_ops:
        return None
    stale = find((view.cluster.get("status") or {}).get("conditions"), names.BUNDLE_BACKUP_STALE)
    if stale is not None and stale.get("status") == "True":
        return f"ichord cluster bundle-export {view.name} -n {view.namespace}{view.flags}"
    return None


def _operation(view: ClusterView, op: Obj, now: dt.datetime) -> list[str]:
    status, read = op.get("status") or {}, OperationView.of(op)
    parts = [f"{_name(op)}", _kind(op), f"phase {_phase(op)}"]
    if read.stage:
        parts.append(f"stage {read.stage}")
    if read.step:
        parts.append(f"step {read.step}")
    progress = status.get("progress") or {}
    if progress.get("steps"):
        parts.append(f"progress {progress['steps']}")
    if progress.get("eta") and _phase(op) not in FINISHED:
        left = (parse_time(str(progress["eta"])) - now).total_seconds()
        parts.append(f"eta {progress['eta']} ({f'in {_duration(left)}' if left >= 0 else 'overdue'})")
    lines = ["  " + "  ".join(parts)]
    cond = _operation_condition(op)
    if cond:
        lines.append(f"    waiting for: {cond.get('reason', '')}: {_text(cond.get('message'))}")
    elif status.get("message"):
        lines.append(f"    {_text(status.get('message'))}")
    ignored = find(status.get("conditions"), names.SPEC_CHANGE_IGNORED)
    if ignored is not None and ignored.get("status") == "True":
        lines.append(f"    spec change ignored: {_text(ignored.get('message'))}")
    lines.append(f"    next: {next_step(op, view.name, view.namespace, view.flags)}")
    return lines


def _operation_condition(op: Obj) -> Obj:
    """The condition the operation's kind reports its progress in (its description's)."""
    return OperationView.of(op).condition() or {}


def _machine_fingerprints(machine: Obj, cluster_certs: Sequence[Obj]) -> str:
    """The machine's own CA fingerprints when its status has them, else the cluster's (marked so)."""
    own = (machine.get("status") or {}).get("certificates") or []
    certs, suffix = (own, "") if own else (cluster_certs, " (cluster)" if cluster_certs else "")
    text = " ".join(f"{c.get('name')}={_short(c.get('fingerprint'))}" for c in certs if c.get("fingerprint"))
    return (text + suffix) if text else "-"


def _table(header: list[str], rows: list[list[str]], *, empty: str) -> list[str]:
    if not rows:
        return [f"  {empty}"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(str(cell).ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in [header, *rows]]


def _age(stamp: Any, now: dt.datetime) -> str:
    if not stamp:
        return "-"
    return _duration((now - parse_time(str(stamp))).total_seconds())


def _until(stamp: Any, now: dt.datetime) -> str:
    if not stamp:
        return "-"
    seconds = (parse_time(str(stamp)) - now).total_seconds()
    return _duration(seconds) if seconds >= 0 else f"expired {_duration(-seconds)} ago"


def _duration(seconds: float) -> str:
    """kubectl's style: 45s, 12m, 5h, 3d (the largest unit, whole)."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size * (2 if unit != "m" else 1):
            return f"{s // size}{unit}"
    return f"{s}s"


def _short(fingerprint: Any) -> str:
    return str(fingerprint or "")[:SHORT_FINGERPRINT] or "-"


def _text(message: Any) -> str:
    return " ".join(SCRUBBER.text(str(message or "")).split())


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _kind(op: Obj) -> str:
    return str((op.get("spec") or {}).get("kind", ""))


def _phase(op: Obj) -> str:
    return str((op.get("status") or {}).get("phase") or Phase.PENDING)


def _rotates_cas(op: Obj) -> bool:
    kind = OperationView.of(op).description
    return kind is not None and kind.rotates_cas


def _section(op: Obj) -> Obj:
    """The status section the operation's kind keeps its progress in (api/operation_kinds.py)."""
    kind = OperationView.of(op).description
    found: Obj = ((op.get("status") or {}).get(kind.section) or {}) if kind is not None and kind.section else {}
    return found


def _cluster_ref(obj: Obj) -> str:
    return str(((obj.get("spec") or {}).get("clusterRef") or {}).get("name", ""))


def _created(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp", ""))


def _finished_at(op: Obj) -> str:
    return str((op.get("status") or {}).get("completedAt") or _created(op))
