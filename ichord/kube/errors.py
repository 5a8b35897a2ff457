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

from ichord.errors import IchordError

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
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        return from_status(int(exc.status or 0), exc.body, str(exc.reason or ""))
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError)):
        return TLSVerificationError(
            f"the Kubernetes API server's certificate is not trusted ({_short(exc)}); the trust store "
            f"must hold the CA that signs it", status=0)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, aiohttp.ServerTimeoutError)):
        return KubeTimeout("the Kubernetes API call timed out; the API server is slow or unreachable", status=0)
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return Unavailable(f"the Kubernetes API server is unreachable: {_short(exc)}", status=0)
    raise TypeError(f"not a Kubernetes API failure: {type(exc).__name__}")


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE]


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
