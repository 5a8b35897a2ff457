"""metav1.Status failures exactly as the API server writes them (code, reason, message, details)."""

from __future__ import annotations

from typing import Any

from ichord.sim.kube.resources import ResourceType

JSON = dict[str, Any]


class ApiError(Exception):
    """A request the simulated API server refuses; ``status()`` is the body it sends."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": self.message, "reason": self.reason, "code": self.code}
        if not self.reason:  # an error the server has no reason for (an internal one) carries none
            del body["reason"]
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rt: ResourceType, name: str) -> JSON:
    return {"name": name, "group": rt.group, "kind": rt.plural}


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}',
                    _details(rt, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(rt: ResourceType, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (reason, field, message) like field.ErrorList."""
    text = ", ".join(f"{f}: {m}" for _r, f, m in causes)
    if len(causes) > 1:
        text = "[" + text + "]"
    details = {"name": name, "group": rt.group, "kind": rt.kind,
               "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes]}
    return ApiError(422, "Invalid", f'{rt.kind}.{rt.group or "core"} "{name}" is invalid: {text}'
                    if rt.group else f'{rt.kind} "{name}" is invalid: {text}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media(content_type: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                    f"accepted media types include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml (got {content_type})")


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_many_requests(message: str, causes: list[JSON] | None = None) -> ApiError:
    return ApiError(429, "TooManyRequests", message, {"causes": causes or []})


def internal(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}")
