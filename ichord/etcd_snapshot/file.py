"""An etcd snapshot written to disk atomically, never over an existing file, and checked as it streams in.

The bytes go to a temporary file beside the destination (mode 0600, created exclusively); once the stream ended
and the content is an etcd snapshot (a bbolt database: its meta page's magic; and, when the stream carries it,
etcd's SHA-256 of the database as its last 32 bytes, which must match) the file is fsynced and hard-linked to its
name, which fails if anything exists there (no check-then-rename race), and the temporary name is removed. A
failure anywhere removes the temporary file: nothing is left under the destination's name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

from ichord.errors import IchordError

#: bbolt's magic (meta page, right after the 16-byte page header) and etcd's trailer (Maintenance.Snapshot appends
#: the SHA-256 of the database; etcdutl snapshot restore checks it when ``size % 512 == 32``).
BOLT_MAGIC = 0xED0CDAED
TRAILER = hashlib.sha256().digest_size
PARTIAL = ".partial-"


class SnapshotDestinationError(IchordError):
    """The destination cannot take the snapshot (exists, no such directory, not writable): bad input."""


class SnapshotIntegrityError(IchordError):
    """What the node streamed is not a whole etcd snapshot."""


class SnapshotWriteError(IchordError):
    """The local write failed (a full disk, an I/O error): not the node's fault, so no other node is asked."""


@dataclass(frozen=True)
class SnapshotFile:
    path: Path
    size: int
    sha256: str  # of the whole file, as written
    #: etcd's own SHA-256 trailer was present and matched the database (False: the stream had none).
    trailer_verified: bool


def check_destination(path: Path) -> Path:
    """The absolute destination, or why it cannot be written (nothing is created)."""
    path = path.expanduser()
    if path.is_dir():
        raise SnapshotDestinationError(f"{path} is a directory; name a file in it, e.g. {path / 'etcd.db'}")
    if path.exists() or path.is_symlink():
        raise SnapshotDestinationError(f"{path} exists; an etcd snapshot never overwrites a file: choose a new name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SnapshotDestinationError(f"{parent} is not a directory; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SnapshotDestinationError(f"{parent} is not writable by this user")
    return path.absolute()


def partial_files(path: Path) -> list[Path]:
    """Temporary files a killed writer left for ``path`` (removed before a new attempt)."""
    return sorted(path.parent.glob(f".{path.name}{PARTIAL}*"))


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
    """``with AtomicSnapshot(path) as out: out.write(chunk)...; result = out.commit()``."""

    def __init__(self, path: Path) -> None:
        self.path = check_destination(path)
        self._temp = self.path.parent / f".{self.path.name}{PARTIAL}{secrets.token_hex(4)}"
        try:
            self._fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise SnapshotDestinationError(f"cannot create a file in {self.path.parent}: "
                                           f"{exc.strerror or exc}") from None
        self._check = StreamCheck()
        self._done = False

    def __enter__(self) -> AtomicSnapshot:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._done:
            self.abort()

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            raise SnapshotWriteError(f"writing {self.path} failed after {self._check.size} bytes: "
                                     f"{exc.strerror or exc}") from None
        self._check.update(chunk)

    def commit(self) -> SnapshotFile:
        """Check the content, make it durable and give it its name (never replacing a file)."""
        checked = self._check.verdict(self.path)
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise SnapshotWriteError(f"writing {self.path} failed: {exc.strerror or exc}") from None
        os.close(self._fd)
        self._fd = -1
        try:
            os.link(self._temp, self.path)
        except FileExistsError:
            raise SnapshotDestinationError(f"{self.path} appeared while the snapshot was taken; it was not "
                                           "overwritten") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise SnapshotWriteError(f"naming {self.path} failed: {exc.strerror or exc}") from None
            # A filesystem without hard links: rename, after a last look (only a concurrent writer of this very
            # name could slip in between).
            if self.path.exists():
                raise SnapshotDestinationError(f"{self.path} appeared while the snapshot was taken; it was not "
                                               "overwritten") from None
            os.rename(self._temp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self._temp.unlink()
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._done = True
        return checked

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self._temp.unlink()
        self._done = True


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
