"""Take an etcd snapshot from a healthy control plane (Talos's EtcdSnapshot) into a file, atomically.

"Healthy": the node answers EtcdStatus with a leader and no errors, and its member has no CORRUPT alarm. A
follower is asked first (the leader carries the cluster's writes), the leader when no follower qualifies; if a
node fails mid-stream the next healthy one is asked, the temporary file discarded each time. Reads only: the
client certificate is minted with the role ``os:etcd:backup`` (enough for these calls, nothing else).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from ichord.errors import IchordError
from ichord.etcd_snapshot.file import AtomicSnapshot, SnapshotFile, SnapshotSink
from ichord.talos.client import TalosClient
from ichord.talos.errors import TalosCertificateError, TalosError
from ichord.talos.proto.gen.machine import machine_pb2 as m

#: The least Talos role that may take (and health-check for) a snapshot.
BACKUP_ROLE = "os:etcd:backup"


class NoHealthyControlPlane(IchordError):
    """No control plane could serve a snapshot; the message names each one and why."""

    def __init__(self, message: str, *, certificate_refused: bool = False) -> None:
        super().__init__(message)
        #: Every control plane refused the client certificate (another OS CA may be the one they accept).
        self.certificate_refused = certificate_refused


@dataclass(frozen=True)
class ControlPlane:
    name: str
    endpoint: str


@dataclass(frozen=True)
class Taken:
    file: SnapshotFile
    machine: str
    member_id: int
    revision: int  # the member's raft index when it was asked


async def _health(talos: TalosClient, cp: ControlPlane,
                  alarms: list[m.EtcdMemberAlarm] | None) -> tuple[m.EtcdMemberStatus | None, str | TalosError,
                                                                  list[m.EtcdMemberAlarm] | None]:
    """The member's status, or why it cannot serve; the cluster's alarms (EtcdAlarmList lists every member's:
    asked once, of the first node that answers)."""
    try:
        status = await talos.etcd_status(cp.endpoint)
        if alarms is None:
            alarms = await talos.etcd_alarms(cp.endpoint)
    except TalosError as exc:
        return None, exc, alarms
    if status.errors:
        return None, "etcd reports " + "; ".join(status.errors), alarms
    if not status.leader:
        return None, "its etcd member has no leader", alarms
    if any(a.member_id == status.member_id and a.alarm == m.EtcdMemberAlarm.CORRUPT for a in alarms):
        return None, "its etcd member raised the CORRUPT alarm", alarms
    return status, "", alarms


async def take(talos: TalosClient, control_planes: Sequence[ControlPlane], path: Path, *,
               sink: Callable[[Path], SnapshotSink] = AtomicSnapshot) -> Taken:
    """The snapshot at ``path`` (never overwriting; nothing left there on failure) from the first healthy one.
    ``sink``: where the bytes go (a file, atomically; a rehearsal's sink checks them and keeps nothing)."""
    healthy: list[tuple[ControlPlane, m.EtcdMemberStatus]] = []
    why: list[str] = []
    refused = 0
    alarms: list[m.EtcdMemberAlarm] | None = None
    for cp in control_planes:  # per node one EtcdStatus; EtcdAlarmList once; then one EtcdSnapshot
        status, reason, alarms = await _health(talos, cp, alarms)
        if status is None:
            why.append(f"{cp.name}: {reason}")
            refused += isinstance(reason, TalosCertificateError)
        else:
            healthy.append((cp, status))
    healthy.sort(key=lambda h: h[1].leader == h[1].member_id)  # followers first
    for cp, status in healthy:
        with sink(path) as out:
            try:
                await talos.etcd_snapshot(cp.endpoint, out.write)
            except TalosError as exc:
                why.append(f"{cp.name}: {exc}")
                continue
            # fsync of a database of up to gigabytes: off the event loop (a leader must keep renewing its Lease).
            committed = await anyio.to_thread.run_sync(out.commit)
            return Taken(committed, cp.name, int(status.member_id), int(status.raft_index))
    if not why:
        raise NoHealthyControlPlane("the cluster has no approved control plane to take a snapshot from")
    raise NoHealthyControlPlane("no control plane could serve an etcd snapshot: " + "; ".join(why),
                                certificate_refused=refused == len(control_planes) > 0)
