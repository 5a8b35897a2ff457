"""Loading a client certificate and key into an SSLContext without writing the key to disk.

``ssl`` reads a chain only from a path, so the path is a memory file: a memfd has no directory entry and
is closed as soon as OpenSSL has read it. Without memfd or /proc the PEM goes to a 0700 directory removed
before this returns. The Kubernetes client and the Talos dial both load their minted certificates here.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
from pathlib import Path

_PROC_FD = Path("/proc/self/fd")


def load_cert_chain_from_memory(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    if hasattr(os, "memfd_create") and _PROC_FD.is_dir():
        fds: list[int] = []
        try:
            for data in (cert_pem, key_pem):
                fd = os.memfd_create("ichord-tls", os.MFD_CLOEXEC)
                fds.append(fd)
                _write_all(fd, data)
            ctx.load_cert_chain(str(_PROC_FD / str(fds[0])), str(_PROC_FD / str(fds[1])))
        finally:
            for fd in fds:
                os.close(fd)
        return
    tmp = tempfile.mkdtemp(prefix="ichord-tls-")  # mode 0700
    try:
        paths = [os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")]
        for path, data in zip(paths, (cert_pem, key_pem), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        ctx.load_cert_chain(paths[0], paths[1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
