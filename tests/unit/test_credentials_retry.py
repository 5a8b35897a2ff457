"""The hand-off's error classification (a table) and the retry loop's window and single waiting line."""

from __future__ import annotations

import ssl

import pytest

from ichord.credentials.retry import Retrier, RetryWindowExceeded, Verdict, classify
from ichord.kube.client import NoTrustError
from ichord.kube.errors import KubeError, Unavailable, from_exception, from_status
from ichord.talos.errors import (
    TalosCertificateError,
    TalosDeadlineError,
    TalosPermissionDeniedError,
    TalosUnreachableError,
)

T, F = Verdict.TRANSIENT, Verdict.FINAL
WEBHOOK_TIMEOUT = ('Internal error occurred: failed calling webhook "v.example.com": failed to call webhook: '
                   'Post "https://svc.ns.svc:443/validate?timeout=10s": context deadline exceeded')


def status(code: int, reason: str, message: str, details: dict[str, str] | None = None) -> dict[str, object]:
    body: dict[str, object] = {"kind": "Status", "status": "Failure", "code": code, "reason": reason,
                               "message": message}
    if details is not None:
        body["details"] = details
    return body


CASES: list[tuple[str, BaseException, Verdict]] = [
    ("connection refused", from_exception(ConnectionRefusedError(111, "Connection refused")), T),
    ("connection reset", from_exception(ConnectionResetError(104, "Connection reset by peer")), T),
    ("call timed out", from_exception(TimeoutError()), T),
    ("503", from_status(503, status(503, "ServiceUnavailable", "the server is currently unable")), T),
    ("504", from_status(504, status(504, "Timeout", "the server was unable to return a response")), T),
    ("502 from a proxy, not JSON", from_status(502, b"<html>bad gateway</html>", "Bad Gateway"), T),
    ("429", from_status(429, status(429, "TooManyRequests", "too many requests")), T),
    ("500 webhook deadline", from_status(500, status(500, "InternalError", WEBHOOK_TIMEOUT)), T),
    ("500 webhook refused connection", from_status(500, status(
        500, "InternalError", 'failed calling webhook "w": dial tcp 10.0.0.1:443: connect: connection refused')), T),
    ("500 etcd timeout", from_status(500, status(500, "InternalError", "etcdserver: request timed out")), T),
    ("500 anything else", from_status(500, status(500, "InternalError", "a bug in an aggregated API")), F),
    ("404 resource type not served", from_status(404, status(
        404, "NotFound", "the server could not find the requested resource")), T),
    ("404 page not found (plain text)", from_status(404, b"404 page not found", "Not Found"), T),
    ("404 of an object", from_status(404, status(
        404, "NotFound", 'secrets "x" not found', {"name": "x", "kind": "secrets"})), F),
    ("401", from_status(401, status(401, "Unauthorized", "Unauthorized")), F),
    ("403", from_status(403, status(403, "Forbidden", 'secrets "x" is forbidden: User "u" cannot get',
                                    {"name": "x", "kind": "secrets"})), F),
    ("422", from_status(422, status(422, "Invalid", "metadata.annotations: Invalid value")), F),
    ("400", from_status(400, status(400, "BadRequest", "bad patch")), F),
    ("webhook denial 400", from_status(400, status(
        400, "BadRequest", 'admission webhook "v.example.com" denied the request: no')), F),
    ("webhook denial 403", from_status(403, status(
        403, "Forbidden", 'admission webhook "v.example.com" denied the request: no')), F),
    ("webhook denial inside a 500", from_status(500, status(
        500, "InternalError", 'admission webhook "v" denied the request: context deadline exceeded')), F),
    ("server certificate not trusted", from_exception(ssl.SSLCertVerificationError("bad")), F),
    ("no trust at all", NoTrustError("no CA"), F),
    ("plain KubeError", KubeError("something"), F),
    ("Talos unreachable", TalosUnreachableError("10.0.0.1:50000", "Version", "connection refused"), T),
    ("Talos deadline", TalosDeadlineError("10.0.0.1:50000", "Version", "deadline"), T),
    ("Talos certificate refused", TalosCertificateError("10.0.0.1:50000", "Version", "bad certificate"), F),
    ("Talos permission denied", TalosPermissionDeniedError("10.0.0.1:50000", "Version", "denied"), F),
    ("not an API error", ValueError("x"), F),
]


@pytest.mark.parametrize(("name", "exc", "verdict"), CASES, ids=[c[0] for c in CASES])
def test_classify(name: str, exc: BaseException, verdict: Verdict) -> None:
    assert classify(exc) is verdict, name


@pytest.mark.anyio
async def test_transient_errors_are_retried_and_announced_once() -> None:
    said: list[str] = []
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise Unavailable("the Kubernetes API server is unreachable: connection refused", status=0)
        return "ok"

    retry = Retrier(window=5.0, say=said.append, delays=(0.001, 0.002))
    assert await retry.call("reading X", flaky) == "ok"
    assert calls == 4
    assert len(said) == 1 and said[0].startswith("waiting for the Kubernetes API (reading X:")
    calls = 0
    assert await retry.call("reading Y", flaky) == "ok"  # a second outage in the same run: no second line
    assert len(said) == 1


@pytest.mark.anyio
async def test_the_window_ends_with_a_typed_error_naming_the_last_error() -> None:
    now = [0.0]

    async def down() -> None:
        now[0] += 1.0  # each attempt "takes" a second of the fake clock
        raise Unavailable("the Kubernetes API server is unreachable: connection refused", status=0)

    retry = Retrier(window=10.0, say=lambda _: None, delays=(0.0, 0.0), clock=lambda: now[0])
    with pytest.raises(RetryWindowExceeded, match=r"reading X: still failing after 10 s.*connection refused"):
        await retry.call("reading X", down)
    assert 10.0 <= now[0] <= 12.0


@pytest.mark.anyio
async def test_a_final_error_stops_at_once_without_waiting() -> None:
    said: list[str] = []
    calls = 0

    async def forbidden() -> None:
        nonlocal calls
        calls += 1
        raise from_status(403, status(403, "Forbidden", "no"))

    with pytest.raises(KubeError, match="Forbidden"):
        await Retrier(window=600.0, say=said.append, delays=(0.0, 0.0)).call("reading X", forbidden)
    assert calls == 1 and said == []
