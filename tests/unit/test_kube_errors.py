"""API failures become typed errors with the status code and reason."""

from __future__ import annotations

import json
import ssl

import aiohttp
import pytest

from ichord.kube import errors


def status(code: int, reason: str, message: str = "m") -> str:
    return json.dumps({"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message})


@pytest.mark.parametrize(("code", "reason", "cls"), [
    (404, "NotFound", errors.NotFound), (409, "Conflict", errors.Conflict),
    (409, "AlreadyExists", errors.AlreadyExists), (422, "Invalid", errors.Invalid),
    (403, "Forbidden", errors.Forbidden), (410, "Expired", errors.Gone), (410, "Gone", errors.Gone),
    (429, "TooManyRequests", errors.TooManyRequests), (503, "ServiceUnavailable", errors.Unavailable),
    (500, "InternalError", errors.Unavailable), (504, "Timeout", errors.KubeTimeout),
    (401, "Unauthorized", errors.Unauthorized), (400, "BadRequest", errors.BadRequest),
])
def test_status_bodies_map_to_types(code: int, reason: str, cls: type[errors.KubeError]) -> None:
    err = errors.from_status(code, status(code, reason, "what happened"))
    assert type(err) is cls and err.status == code and err.reason == reason
    assert "what happened" in str(err)


def test_non_json_body_and_retryable_flags() -> None:
    err = errors.from_status(502, b"<html>bad gateway</html>", "Bad Gateway")
    assert isinstance(err, errors.Unavailable) and err.retryable and err.status == 502
    assert errors.Conflict("x").retryable and not errors.NotFound("x").retryable


def test_transport_failures() -> None:
    assert isinstance(errors.from_exception(TimeoutError()), errors.KubeTimeout)
    assert isinstance(errors.from_exception(ConnectionRefusedError(111, "refused")), errors.Unavailable)
    assert isinstance(errors.from_exception(ssl.SSLCertVerificationError("bad cert")), errors.TLSVerificationError)
    assert isinstance(errors.from_exception(aiohttp.ServerDisconnectedError()), errors.Unavailable)
    with pytest.raises(errors.NotFound), errors.translate():
        raise errors.NotFound("already typed")
    with pytest.raises(TypeError):
        errors.from_exception(ValueError("not an API failure"))
