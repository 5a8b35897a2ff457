"""Kubernetes API failures as typed exceptions carrying the status code and reason.

``translate()`` turns kubernetes-asyncio's ApiException, aiohttp's connection and TLS errors and
timeouts into these, so callers branch on a type, never on a string.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from ichord.errors import IchordError, network_cause, verify_reason

_MAX_MESSAGE = 500


class KubeError(IchordError):
    """An API call failed; ``status`` is the HTTP code (0 when no response came), ``reason`` the Status reason."""

    status: int = 0
    default_reason: str = ""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.reason = reason or self.default_reason
        self.details = details or {}
        #: The full chain of what failed underneath, for the debug log; the message is the summary.
        self.detail = message

    @property
    def retryable(self) -> bool:
        return False


class KubeConfigError(KubeError):
    """The kubeconfig cannot be used (missing, malformed, no such context); the message says which file."""


class NotFound(KubeError):
    status, default_reason = 404, "NotFound"


class Conflict(KubeError):
    """409 Conflict: the object changed since it was read (re-read and retry)."""

    status, default_reason = 409, "Conflict"

    @property
    def retryable(self) -> bool:
        return True


class AlreadyExists(KubeError):
    status, default_reason = 409, "AlreadyExists"


class Invalid(KubeError):
    """422: the object violates the schema; ``causes`` name the fields."""

    status, default_reason = 422, "Invalid"

    @property
    def causes(self) -> list[dict[str, Any]]:
        causes: list[dict[str, Any]] = self.details.get("causes") or []
        return causes


class BadRequest(KubeError):
    status, default_reason = 400, "BadRequest"


class Unauthorized(KubeError):
    status, default_reason = 401, "Unauthorized"


class Forbidden(KubeError):
    status, default_reason = 403, "Forbidden"


class Gone(KubeError):
    """410: the resourceVersion is older than the server keeps (re-list)."""

    status, default_reason = 410, "Expired"


class TooManyRequests(KubeError):
    """429: throttled, or an eviction a PodDisruptionBudget refuses."""

    status, default_reason = 429, "TooManyRequests"

    @property
    def retryable(self) -> bool:
        return True


class Unavailable(KubeError):
    """The API server could not be reached or failed (5xx, connection refused/reset)."""

    default_reason = "ServiceUnavailable"

    @property
    def retryable(self) -> bool:
        return True


class KubeTimeout(Unavailable):
    default_reason = "Timeout"


class TLSVerificationError(Unavailable):
    """The server's certificate is not trusted (or names another host); the trust store must change."""

    default_reason = "x509"


_BY_REASON: dict[str, type[KubeError]] = {
    "AlreadyExists": AlreadyExists, "Conflict": Conflict, "Expired": Gone, "Gone": Gone,
}
_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone,
    422: Invalid, 429: TooManyRequests, 504: KubeTimeout,
}


def from_status(code: int, body: Any, fallback: str = "") -> KubeError:
    """The typed error for an HTTP status and a (possibly JSON Status) body."""
    status: dict[str, Any] = {}
    if isinstance(body, (bytes, str)):
        try:
            loaded = json.loads(body)
            status = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            status = {}
    elif isinstance(body, dict):
        status = body
    reason = str(status.get("reason") or fallback or "")
    message = str(status.get("message") or fallback or f"HTTP {code}")[:_MAX_MESSAGE]
    cls = _BY_REASON.get(reason) or _BY_STATUS.get(code) or (Unavailable if code >= 500 or code == 0 else KubeError)
    return cls(f"Kubernetes API: {message} ({code} {reason})".rstrip(), status=code, reason=reason or None,
               details=status.get("details") if isinstance(status.get("details"), dict) else None)


def from_exception(exc: BaseException) -> KubeError:
    """The typed error of a failed call; its message is a one-line summary, ``detail`` the whole chain."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        return from_status(int(exc.status or 0), exc.body, str(exc.reason or ""))
    out: KubeError
    where = _where(exc)
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError)):
        out = TLSVerificationError(
            f"the Kubernetes API server{where}: its certificate is not trusted ({verify_reason(exc)}); the trust "
            f"store must hold the CA that signs it", status=0)
    elif isinstance(exc, (asyncio.TimeoutError, TimeoutError, aiohttp.ServerTimeoutError)):
        out = KubeTimeout(f"the Kubernetes API server{where} did not answer in time (timed out); it is slow or "
                          f"unreachable", status=0)
    elif isinstance(exc, (aiohttp.ClientError, OSError)):
        out = Unavailable(f"the Kubernetes API server{where} is unreachable: {_cause(exc)}", status=0)
    else:
        raise TypeError(f"not a Kubernetes API failure: {type(exc).__name__}")
    out.detail = _chain(exc)
    return out


def _where(exc: BaseException) -> str:
    """`` at host:port`` when the error knows the address (aiohttp's connector errors do)."""
    host, port = getattr(exc, "host", None), getattr(exc, "port", None)
    if not host:
        return ""
    host = f"[{host}]" if ":" in str(host) else str(host)
    return f" at {host}:{port}" if port else f" at {host}"


def _cause(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    return network_cause(exc)


def _chain(exc: BaseException) -> str:
    """Every exception under ``exc``, for the debug log (reprs of objects included: no secrets live there)."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}"[:_MAX_MESSAGE])
        cur = cur.__cause__ or cur.__context__
    return "; caused by ".join(parts)


TRANSLATED: tuple[type[BaseException], ...] = (
    ApiException, aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError, ssl.SSLError,
)


@contextmanager
def translate() -> Iterator[None]:
    """Re-raise API, connection, TLS and timeout failures as KubeError subclasses."""
    try:
        yield
    except KubeError:
        raise
    except TRANSLATED as exc:
        raise from_exception(exc) from exc
