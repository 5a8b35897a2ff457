"""The root of ichord's typed errors.

Every error a user can see carries a message that names the problem and what to do next; messages
never carry key or certificate material (the scrubber is the last line of defence, not the first).
"""

from __future__ import annotations

import errno
import re
import socket
import ssl


class IchordError(Exception):
    """Base class of every error ichord raises on purpose."""


class RuntimeFailure(IchordError):
    """The input was fine but the world did not cooperate (a retry window ran out, a write did not read back):
    a command exits 1 for it, not 2 (ichord.cli.exit_code)."""


# errno -> the words an operator searches for; anything else falls back to the OS's own text.
_ERRNO_WORDS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ETIMEDOUT: "timed out",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ECONNRESET: "connection reset",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "connection closed",
    errno.EADDRNOTAVAIL: "address not available",
}


def network_cause(exc: BaseException) -> str:
    """The root cause of a failed connection in a few words ("connection refused", "certificate not trusted
    (...)", "timed out", "name not resolved (...)"): no object reprs, no addresses, no nested chains.

    Follows ``__cause__``/``__context__`` to the innermost OS or TLS error, which is the one that says why.
    """
    root = _innermost(exc)
    if isinstance(root, ssl.SSLCertVerificationError):
        return f"certificate not trusted ({verify_reason(root)})"
    if isinstance(root, ssl.SSLError):
        return f"TLS failed ({root.reason or type(root).__name__})"
    if isinstance(root, socket.gaierror):
        return f"name not resolved ({root.strerror})" if root.strerror else "name not resolved"
    if isinstance(root, TimeoutError):
        return "timed out"
    if isinstance(root, OSError):
        if root.errno in _ERRNO_WORDS:
            return _ERRNO_WORDS[root.errno]
        if isinstance(root, ConnectionRefusedError):
            return "connection refused"
        if isinstance(root, ConnectionResetError):
            return "connection reset"
        return _plain(root.strerror or str(root)) or type(root).__name__
    return _plain(str(root)) or type(root).__name__


def verify_reason(exc: BaseException) -> str:
    """Why TLS verification refused a certificate ("unable to get local issuer certificate", "Hostname mismatch...")."""
    root = _innermost(exc)
    why = getattr(root, "verify_message", None) or getattr(root, "reason", None)
    return _plain(str(why)) if why else "verification failed"


def _innermost(exc: BaseException) -> BaseException:
    """The deepest OS/TLS error under ``exc`` (``exc`` itself when there is none)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    found = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError | TimeoutError):
            found = cur
        # aiohttp keeps the socket error on the exception as well as in the chain
        inner = getattr(cur, "os_error", None) or getattr(cur, "certificate_error", None)
        if isinstance(inner, BaseException) and id(inner) not in seen:
            cur = inner
            continue
        cur = cur.__cause__ or cur.__context__
    return found


def _plain(text: str) -> str:
    """Drop ``<... object at 0x...>`` reprs and collapse whitespace."""
    return " ".join(_OBJECT_REPR.sub("", text).split())


_OBJECT_REPR = re.compile(r"\S*<[^<>]* object at 0x[0-9a-fA-F]+>")
