"""Files a command writes: atomically, mode 0600, never over an existing file unless asked, never into a
directory that does not exist (docs/decisions.md#cli-files).

The bytes go to a temporary file beside the destination (created exclusively, mode 0600), are fsynced, and the
file gets its name last: hard-linked, which fails if anything exists there (no check-then-rename race), or, with
``force``, renamed over the old file. A failure anywhere removes the temporary file, so nothing is left under the
destination's name and a reader never sees half a file. ``ichord bundle generate``, ``cluster bundle-export``,
``cluster credentials`` and ``cluster etcd-snapshot`` (which checks its stream as it comes in) all write through
``AtomicFile``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path
from types import TracebackType

from ichord.errors import IchordError, RuntimeFailure

#: A killed writer's temporary file for ``name`` is ``.name.partial-XXXXXXXX`` (``partial_files`` finds them).
PARTIAL = ".partial-"


class DestinationError(IchordError):
    """The destination cannot take the file (it exists, is a directory, its directory does not exist or is not
    writable): bad input, nothing was written (exit 2)."""


class FileWriteError(RuntimeFailure):
    """The local write failed (a full disk, an I/O error): nothing was left under the destination's name."""


def check_destination(path: Path, *, force: bool = False, flag: str | None = "--force") -> Path:
    """The absolute destination, or why it cannot be written (nothing is created).

    ``force`` allows replacing an existing regular file (never a directory); ``flag`` is how the command spells
    it, for the message (None: the command never replaces a file)."""
    path = path.expanduser()
    if path.is_dir():
        raise DestinationError(f"{path} is a directory; name a file in it, e.g. {path / 'FILE'}")
    if (path.exists() or path.is_symlink()) and not force:
        raise DestinationError(f"{path} exists; it is not overwritten: choose a new name"
                               + (f", or pass {flag} to replace it" if flag else ""))
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise DestinationError(f"{parent} is not a directory; create it first (mkdir -p {parent})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(f"{parent} is not writable by this user")
    return path.absolute()


def partial_files(path: Path) -> list[Path]:
    """Temporary files a killed writer left for ``path``."""
    return sorted(path.parent.glob(f".{path.name}{PARTIAL}*"))


class AtomicFile:
    """``with AtomicFile(path) as out: out.write(data)...; out.commit()``: see the module docstring."""

    def __init__(self, path: Path, *, force: bool = False, flag: str | None = "--force") -> None:
        self.path = check_destination(path, force=force, flag=flag)
        self.force = force
        self.size = 0
        self._temp = self.path.parent / f".{self.path.name}{PARTIAL}{secrets.token_hex(4)}"
        try:
            self._fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DestinationError(f"cannot create a file in {self.path.parent}: {exc.strerror or exc}") from None
        self._done = False

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._done:
            self.abort()

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError as exc:
            raise FileWriteError(f"writing {self.path} failed after {self.size} bytes: {exc.strerror or exc}") \
                from None
        self.size += len(data)

    def commit(self) -> Path:
        """Make the content durable and give it its name (replacing a file only with ``force``)."""
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise FileWriteError(f"writing {self.path} failed: {exc.strerror or exc}") from None
        os.close(self._fd)
        self._fd = -1
        try:
            self._name()
        finally:
            with contextlib.suppress(FileNotFoundError):
                self._temp.unlink()
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._done = True
        return self.path

    def _name(self) -> None:
        appeared = DestinationError(f"{self.path} appeared while it was being written; it was not overwritten")
        if self.force:
            if self.path.is_dir():
                raise appeared
            try:
                os.replace(self._temp, self.path)
            except OSError as exc:
                raise FileWriteError(f"naming {self.path} failed: {exc.strerror or exc}") from None
            return
        try:
            os.link(self._temp, self.path)
        except FileExistsError:
            raise appeared from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise FileWriteError(f"naming {self.path} failed: {exc.strerror or exc}") from None
            # A filesystem without hard links: rename, after a last look (only a concurrent writer of this very
            # name could slip in between).
            if self.path.exists():
                raise appeared from None
            os.rename(self._temp, self.path)

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        with contextlib.suppress(FileNotFoundError):
            self._temp.unlink()
        self._done = True


def make_private_dirs(directory: Path) -> None:
    """Create the missing directories of ``directory`` with mode 0700 (existing ones are left alone): only for
    ichord's own default places (``~/.ichord/clusters/NAME``); a directory the user names must exist."""
    missing: list[Path] = []
    d = directory.expanduser()
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
            os.chmod(d, 0o700)  # mkdir's mode is masked by the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise DestinationError(f"cannot create {d} ({exc.strerror}); name another place") from None


def write_file(path: Path, data: bytes, *, force: bool = False, flag: str | None = "--force") -> Path:
    """Write ``data`` to ``path`` (mode 0600) through ``AtomicFile``; the absolute path written."""
    with AtomicFile(path, force=force, flag=flag) as out:
        out.write(data)
        return out.commit()
