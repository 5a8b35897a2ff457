"""The etcd snapshot an operation takes before it reboots control planes, when its TalosCluster names where.

    spec.etcdSnapshots: {path: /var/lib/ichord/snapshots, retain: 5}

``path`` is a directory the daemon can write (the chart mounts a volume there: values ``etcdSnapshots``); each
snapshot is ``<namespace>_<cluster>_<UTC time>_<operation>.db`` in it, and after each one only the newest
``retain`` of that cluster are kept (files of other clusters, and files named otherwise, are never touched). The
operations that take one: a ca-rotation of the etcd CA (its roll reboots every control plane) and a config
rollout that reboots a control plane, at their start, before anything is changed (``status.plan.etcdSnapshot``
names the directory, then the file).

Kill-safe, by a record in the operation's status written around the one irreversible step (the file)::

    status.etcdSnapshot {state: Taking, path}        written before EtcdSnapshot is asked for
    the file at path (temporary file, then a hard link: it appears whole or not at all)
    status.etcdSnapshot {state: Taken, path, size, sha256, machine, takenAt}

A step that finds ``Taking`` looks at ``path``: the file is there -> it is recorded (read back), never a second
snapshot; it is not -> the earlier attempt died before the link: its temporary file is removed and the snapshot
taken again to the same path. ``Taken`` -> nothing more. Failpoints: ``etcd-snapshot.marker.after`` (marker
written, nothing asked), ``etcd-snapshot.taken.before`` (the file there, not recorded).

No healthy control plane, an unwritable directory or a damaged stream block the operation (condition, one
Warning) before anything else happens; it retries.

Everything that touches the directory (its check, a killed step's file, the snapshot's bytes, the retention) is
behind one port, ``SnapshotPort``, which the step's context carries: the daemon's is ``DirectorySnapshots``; a
rehearsal's twin hands in one that plays the snapshot from the twin's control plane and writes nothing
(rehearsal/snapshots.py, docs/architecture.md#rehearsal).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio

from ichord.api import names
from ichord.api.conditions import now_rfc3339
from ichord.errors import IchordError
from ichord.etcd_snapshot.file import (
    SnapshotDestinationError,
    SnapshotFile,
    SnapshotIntegrityError,
    SnapshotWriteError,
    describe,
    partial_files,
)
from ichord.etcd_snapshot.take import BACKUP_ROLE, ControlPlane, NoHealthyControlPlane, Taken, take
from ichord.failpoints import failpoint
from ichord.operations import backbone
from ichord.operations.backbone import OperationKind
from ichord.operations.outcome import Blocked
from ichord.pki.bundle import SecretsBundle
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle

Obj = dict[str, Any]

STATUS_KEY = "etcdSnapshot"
TAKING = "Taking"
TAKEN = "Taken"
DEFAULT_RETAIN = 5
#: The most snapshots of a cluster kept (the CRD's maximum; one written before it is refused here, naming it).
MAX_RETAIN = 1000
SUFFIX = ".db"
#: What follows "<namespace>_<cluster>_" in a snapshot's name: its UTC time and the operation.
_STAMPED = re.compile(r"\d{8}T\d{6}Z_[^_/]+\.db")


@dataclass(frozen=True)
class Destination:
    directory: Path
    retain: int

    @classmethod
    def of(cls, cluster_spec: Obj) -> Destination | None:
        """The TalosCluster's spec.etcdSnapshots, or None when it names no destination."""
        raw = cluster_spec.get("etcdSnapshots") or {}
        path = str(raw.get("path") or "")
        if not path:
            return None
        return cls(Path(path), max(1, int(raw.get("retain") or DEFAULT_RETAIN)))

    def prefix(self, namespace: str, cluster: str) -> str:
        # "_" is in no Kubernetes name: "ns_demo_" never matches a cluster "demo.prod" (names may hold dots).
        return f"{namespace}_{cluster}_"

    def file_for(self, namespace: str, cluster: str, operation: str, now: dt.datetime) -> Path:
        return self.directory / f"{self.prefix(namespace, cluster)}{now:%Y%m%dT%H%M%SZ}_{operation}{SUFFIX}"

    def problem(self) -> str | None:
        """Why the daemon cannot write snapshots there, or None."""
        if self.retain > MAX_RETAIN:
            return (f"spec.etcdSnapshots.retain {self.retain} is above {MAX_RETAIN}, the most snapshots of a cluster "
                    "ichord keeps: lower it")
        where = f"spec.etcdSnapshots.path {self.directory}"
        if not self.directory.is_absolute():
            return f"{where} is not an absolute path"
        if not self.directory.is_dir():
            return (f"{where} is not a directory the daemon sees: mount a volume there (the chart's "
                    "etcdSnapshots.volume) or change the TalosCluster's spec.etcdSnapshots.path")
        if not os.access(self.directory, os.W_OK | os.X_OK):
            return f"{where} is not writable by the daemon (uid {os.getuid()}): fix the volume's permissions"
        return None

    def prune(self, namespace: str, cluster: str) -> list[Path]:
        """Remove this cluster's snapshots beyond the newest ``retain`` (names sort by time); the removed."""
        prefix = self.prefix(namespace, cluster)
        mine = sorted(p for p in self.directory.iterdir()
                      if p.name.startswith(prefix) and _STAMPED.fullmatch(p.name[len(prefix):]) and p.is_file())
        gone = mine[:-self.retain] if len(mine) > self.retain else []
        for path in gone:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return gone


class SnapshotPort(Protocol):
    """Where an operation's snapshot goes: the one seam between ``ensure_taken`` and the filesystem."""

    def problem(self, destination: Destination) -> str | None:
        """Why a snapshot cannot go to ``destination``, or None."""
        ...

    async def found(self, path: Path) -> SnapshotFile | None:
        """A killed step's snapshot at ``path``, complete (recorded, never taken again), or None (a killed
        writer's partial file cleared first)."""
        ...

    async def take(self, talos: TalosClient, control_planes: list[ControlPlane], path: Path) -> Taken:
        """The snapshot of the first healthy control plane, as ``path``."""
        ...

    async def prune(self, destination: Destination, namespace: str, cluster: str) -> list[Path]:
        """The retention after a snapshot: the cluster's snapshots removed."""
        ...


def _found(path: Path) -> SnapshotFile | None:
    if path.exists():  # it appears only whole
        return describe(path)
    for leftover in partial_files(path):
        leftover.unlink(missing_ok=True)
    return None


class DirectorySnapshots:
    """The daemon's: each snapshot a file in the destination directory, written atomically, its retention applied
    after each."""

    def problem(self, destination: Destination) -> str | None:
        return destination.problem()

    async def found(self, path: Path) -> SnapshotFile | None:
        return await anyio.to_thread.run_sync(_found, path)  # reads a file whole: off the event loop

    async def take(self, talos: TalosClient, control_planes: list[ControlPlane], path: Path) -> Taken:
        return await take(talos, control_planes, path)

    async def prune(self, destination: Destination, namespace: str, cluster: str) -> list[Path]:
        return await anyio.to_thread.run_sync(destination.prune, namespace, cluster)


def plan_entry(destination: Destination | None, status: Obj) -> Obj | None:
    """status.plan.etcdSnapshot: the directory and retention, and the file once taken."""
    if destination is None:
        return None
    entry: Obj = {"directory": str(destination.directory), "retain": destination.retain}
    record = status.get(STATUS_KEY) or {}
    if record.get("state") == TAKEN and record.get("path"):
        entry["file"] = str(record["path"])
    return entry


def hint(cluster: str, namespace: str) -> str:
    """The plan's warning when no destination is named: the command that takes one by hand."""
    return (f"take an etcd snapshot before starting: ichord cluster etcd-snapshot {cluster} -n {namespace} -f FILE; "
            "or set the TalosCluster's spec.etcdSnapshots.path so ichord takes one before the first reboot")


def dial(bundle: SecretsBundle) -> DialBundle:
    """The client certificate a snapshot is taken with: os:etcd:backup, nothing more (before anything rotated)."""
    return DialBundle.from_bundle(bundle, roles=(BACKUP_ROLE,))


def _record(**fields: Any) -> backbone.Mutation:
    def m(status: Obj) -> None:
        status[STATUS_KEY] = {k: v for k, v in fields.items() if v not in (None, "")}
        plan = status.get("plan")
        if isinstance(plan, dict) and isinstance(plan.get(STATUS_KEY), dict) and fields.get("state") == TAKEN:
            plan[STATUS_KEY] = {**plan[STATUS_KEY], "file": fields["path"]}

    return m


class _Machine(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...


class _Subject(backbone.Subject, Protocol):
    """What a kind's inputs carry that a snapshot needs (both kinds' step inputs do)."""

    @property
    def bundle(self) -> SecretsBundle: ...
    @property
    def control_planes(self) -> Sequence[_Machine]: ...
    @property
    def op_namespace(self) -> str: ...


class _Context(backbone.Context, Protocol):
    @property
    def talos_factory(self) -> Callable[[DialBundle], TalosClient]: ...
    @property
    def etcd_snapshots(self) -> SnapshotPort: ...


async def take_before_reboots(ctx: _Context, kind: OperationKind, subject: _Subject,
                              destination: Destination) -> Blocked | None:
    """``ensure_taken`` from the subject's control planes, over a client with only the backup role, closed after."""
    talos = ctx.talos_factory(dial(subject.bundle))
    try:
        return await ensure_taken(ctx, kind, subject, destination, talos,
                                  [ControlPlane(m.name, m.address) for m in subject.control_planes],
                                  namespace=subject.op_namespace)
    finally:
        talos.close()


async def ensure_taken(ctx: _Context, kind: OperationKind, subject: backbone.Subject,
                       destination: Destination, talos: TalosClient, control_planes: list[ControlPlane],
                       *, namespace: str) -> Blocked | None:
    """One snapshot for this operation, in ``destination``, exactly once across kills; Blocked when it cannot.
    The directory is touched only through ``ctx.etcd_snapshots``."""
    record = subject.status.get(STATUS_KEY) or {}
    if record.get("state") == TAKEN:
        return None
    port = ctx.etcd_snapshots
    why = port.problem(destination)
    if why is not None:
        return await backbone.blocked(ctx, kind, subject, f"etcd snapshot before the first reboot: {why}")
    started = str(record.get("startedAt") or "")
    if record.get("state") == TAKING and record.get("path"):
        path = Path(str(record["path"]))
    else:
        now = ctx.now()
        path = destination.file_for(namespace, subject.cluster_name, subject.name, now)
        started = now_rfc3339(now)
        await backbone.write(ctx, subject, _record(state=TAKING, path=str(path), startedAt=started))
        failpoint("etcd-snapshot.marker.after")
    machine = ""
    try:
        found = await port.found(path)  # a killed step's snapshot, complete: recorded, not taken again
        if found is not None:
            file = found
        else:
            taken = await port.take(talos, control_planes, path)
            file, machine = taken.file, taken.machine
            failpoint("etcd-snapshot.taken.before")
    except (NoHealthyControlPlane, SnapshotIntegrityError, SnapshotDestinationError, SnapshotWriteError,
            OSError) as exc:
        detail = str(exc) if isinstance(exc, IchordError) else f"{path}: {exc.strerror or exc}"
        return await backbone.blocked(ctx, kind, subject, f"etcd snapshot before the first reboot: {detail}")
    await backbone.write(ctx, subject, _record(state=TAKEN, path=str(file.path), size=file.size, sha256=file.sha256,
                                               machine=machine, startedAt=started, takenAt=now_rfc3339(ctx.now())))
    source = f" from {machine}" if machine else ""
    backbone.event(ctx, subject, "Normal", names.EventReason.ETCD_SNAPSHOT_TAKEN,
                   f"etcd snapshot {file.path} ({file.size} bytes, sha256 {file.sha256}){source}, taken before the "
                   "first control-plane reboot")
    removed = await port.prune(destination, namespace, subject.cluster_name)
    if removed:
        backbone.log_transition(kind, subject, "old etcd snapshots removed", kept=destination.retain,
                                removed=[p.name for p in removed])
    return None
