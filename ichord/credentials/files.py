"""Private files: written atomically with mode 0600, missing parent directories created 0700.

Shared by ``ichord cluster bundle-export`` (the secrets bundle) and ``ichord cluster credentials``
(talosconfig and kubeconfig): each file holds a private key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from ichord.errors import IchordError


class PrivateFileError(IchordError):
    """A private file or its directory cannot be written; the message names the path and the OS error."""


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600, atomically; missing parents are created 0700."""
    make_private_dirs(path.parent)
    # A temporary file in the same directory, renamed over the target: a reader never sees half a
    # file, and the content is never in a file with looser permissions.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise PrivateFileError(f"cannot write {path} ({exc.strerror}); choose another path with -o") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_private_dirs(directory: Path) -> None:
    """Create the missing directories of ``directory`` with mode 0700 (existing ones are left alone)."""
    missing: list[Path] = []
    d = directory
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
            raise PrivateFileError(f"cannot create {d} ({exc.strerror}); choose another path with -o") from None
