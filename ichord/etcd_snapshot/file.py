"""An etcd snapshot written to disk atomically, never over an existing file, and checked as it streams in.

The bytes go to a temporary file beside the destination (mode 0600, created exclusively); once the stream ended
and the content is an etcd snapshot (a bbolt database: its meta page's magic; and, when the stream carries it,
etcd's SHA-256 of the database as its last 32 bytes, which must match) the file is fsynced and hard-linked to its
name, which fails if anything exists there (no check-then-rename race), and the temporary name is removed. A
failure anywhere removes the temporary file: nothing is left under the destination's name.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from ichord.errors import IchordError
from ichord.safefile import AtomicFile, DestinationError, FileWriteError, check_destination, partial_files

#: bbolt's magic (meta page, right after the 16-byte page header) and etcd's trailer (Maintenance.Snapshot appends
#: the SHA-256 of the database; etcdutl snapshot restore checks it when ``size % 512 == 32``).
BOLT_MAGIC = 0xED0CDAED
TRAILER = hashlib.sha256().digest_size

__all__ = ["AtomicSnapshot", "SnapshotDestinationError", "SnapshotFile", "SnapshotIntegrityError",
           "SnapshotSink", "SnapshotWriteError", "StreamCheck", "check_destination", "describe", "partial_files"]


#: The shared writer's errors, under the names this package's callers know (ichord.safefile).
SnapshotDestinationError = DestinationError
SnapshotWriteError = FileWriteError


class SnapshotIntegrityError(IchordError):
    """What the node streamed is not a whole etcd snapshot."""


@dataclass(frozen=True)
class SnapshotFile:
    path: Path
    size: int
    sha256: str  # of the whole file, as written
    #: etcd's own SHA-256 trailer was present and matched the database (False: the stream had none).
    trailer_verified: bool


class SnapshotSink(Protocol):
    """Where a streamed snapshot goes (``take``'s ``sink``): ``with sink(path) as out: out.write(chunk)...;
    result = out.commit()``; leaving the block without ``commit`` discards it."""

    def __enter__(self) -> SnapshotSink: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...
    def write(self, chunk: bytes) -> None: ...
    def commit(self) -> SnapshotFile: ...


class StreamCheck:
    """What a snapshot's bytes must be, seen as they stream: a bbolt database (its meta page's magic) and, when the
    stream carries it, etcd's SHA-256 of the database as its last 32 bytes; and the whole stream's SHA-256."""

    def __init__(self) -> None:
        self._whole = hashlib.sha256()
        self._database = hashlib.sha256()  # everything but the last TRAILER bytes seen so far
        self._tail = b""
        self._head = b""
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self._whole.update(chunk)
        self.size += len(chunk)
        if len(self._head) < 20:
            self._head += chunk[:20 - len(self._head)]
        data = self._tail + chunk
        self._database.update(data[:-TRAILER] if len(data) > TRAILER else b"")
        self._tail = data[-TRAILER:]

    def verdict(self, path: Path) -> SnapshotFile:
        """The stream as the snapshot ``path`` (its size and digests), or SnapshotIntegrityError."""
        if len(self._head) < 20 or struct.unpack_from("<I", self._head, 16)[0] != BOLT_MAGIC:
            raise SnapshotIntegrityError(f"the stream ({self.size} bytes) is not an etcd database: no bbolt meta "
                                         "page at its start")
        has_trailer = self.size % 512 == TRAILER
        if has_trailer and self._database.digest() != self._tail:
            raise SnapshotIntegrityError(f"the stream ({self.size} bytes) does not match etcd's SHA-256 of the "
                                         "database it ends with: the snapshot is damaged (nothing was written)")
        return SnapshotFile(path, self.size, self._whole.hexdigest(), has_trailer)


class AtomicSnapshot:
    """``with AtomicSnapshot(path) as out: out.write(chunk)...; result = out.commit()``: ichord.safefile's
    AtomicFile, never over an existing file, with the content checked before it gets its name."""

    def __init__(self, path: Path) -> None:
        self._file = AtomicFile(path, flag=None)  # a snapshot never replaces a file: no --force
        self.path = self._file.path
        self._check = StreamCheck()

    def __enter__(self) -> AtomicSnapshot:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._file.__exit__(exc_type, exc, tb)

    def write(self, chunk: bytes) -> None:
        self._file.write(chunk)
        self._check.update(chunk)

    def commit(self) -> SnapshotFile:
        """Check the content, make it durable and give it its name (never replacing a file)."""
        checked = self._check.verdict(self.path)
        self._file.commit()
        return checked

    def abort(self) -> None:
        self._file.abort()


def describe(path: Path) -> SnapshotFile:
    """A snapshot already on disk (a killed daemon's, found by name): its size and digests, read back."""
    whole, database = hashlib.sha256(), hashlib.sha256()
    size = path.stat().st_size
    remaining = size - TRAILER
    tail = b""
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            whole.update(chunk)
            take = max(0, min(len(chunk), remaining))
            database.update(chunk[:take])
            remaining -= take
            tail = (tail + chunk)[-TRAILER:]
    has_trailer = size % 512 == TRAILER
    if has_trailer and database.digest() != tail:
        raise SnapshotIntegrityError(f"{path} does not match etcd's SHA-256 it ends with")
    return SnapshotFile(path, size, whole.hexdigest(), has_trailer)
