"""The twin's etcd snapshots: played, never taken (the twin's ``SnapshotPort``, operations/etcd_snapshot.py).

The real run takes a snapshot to the TalosCluster's spec.etcdSnapshots.path before its first control-plane reboot,
then keeps the cluster's newest ``retain`` there. The twin runs the same step through this port: the snapshot is
streamed from one of the twin's control planes (its health checks and the stream's integrity checks as the real
run meets them) and its bytes are checked and kept nowhere; the directory is neither looked at nor pruned. It is
the daemon's directory, not this machine's: whether the daemon can write it is not a thing a rehearsal can see.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from ichord.etcd_snapshot.file import SnapshotFile, StreamCheck
from ichord.etcd_snapshot.take import ControlPlane, Taken, take
from ichord.operations.etcd_snapshot import Destination
from ichord.talos.client import TalosClient


class _Discarded:
    """A snapshot's bytes checked as they stream in (``StreamCheck``) and kept nowhere."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._check = StreamCheck()

    def __enter__(self) -> _Discarded:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def write(self, chunk: bytes) -> None:
        self._check.update(chunk)

    def commit(self) -> SnapshotFile:
        return self._check.verdict(self.path)


class PlayedSnapshots:
    """The twin's port: a snapshot is played from the twin's control planes, nothing is written or removed."""

    def problem(self, destination: Destination) -> str | None:
        return None  # the daemon's directory, not the one this command would see

    async def found(self, path: Path) -> SnapshotFile | None:
        return None  # a file of that name here would be the live daemon's, not the twin's

    async def take(self, talos: TalosClient, control_planes: list[ControlPlane], path: Path) -> Taken:
        return await take(talos, control_planes, path, sink=_Discarded)

    async def prune(self, destination: Destination, namespace: str, cluster: str) -> list[Path]:
        return []
