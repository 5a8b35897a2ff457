"""Server-side field validation (``?fieldValidation=``) of a custom resource's unknown fields, as kube-apiserver does
it (held to the real server by tests/real/test_sim_differential.py):

    Ignore   dropped in silence (pruning)
    Warn     dropped, and each named in an HTTP ``Warning: 299 - "unknown field \\"spec.x\\""`` header (the default)
    Strict   refused: a create or update 400 BadRequest (a strict decoding error); a JSON or merge patch
             422 Invalid naming the patched object; the request writes nothing

Server-side apply refuses an unknown field whatever the directive, with the 500 structured-merge-diff gives
(``failed to create typed patch object ...: .spec.x: field not declared in schema``). A field under
``x-kubernetes-preserve-unknown-fields`` is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ichord.sim.kube.resources import ResourceType
from ichord.sim.kube.status import ApiError, bad_request

DIRECTIVES = ("Ignore", "Strict", "Warn")
#: The options type kube-apiserver names when the directive is not one of them, by verb.
_OPTIONS = {"create": "CreateOptions", "update": "UpdateOptions", "patch": "PatchOptions"}


@dataclass
class FieldValidation:
    """One request's directive, and the warnings its write gathered."""

    directive: str = "Warn"
    #: A JSON or merge patch: the object the patch made, as kube-apiserver shows it in a strict error.
    patched: str | None = None
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, value: str | None, verb: str) -> FieldValidation:
        """The request's directive (absent or empty: Warn); 422 naming the verb's options for any other value."""
        if not value:
            return cls()
        if value not in DIRECTIVES:
            supported = ", ".join(f'"{d}"' for d in ("", *DIRECTIVES))
            message = f'Unsupported value: "{value}": supported values: {supported}'
            kind = _OPTIONS.get(verb, "PatchOptions")
            raise ApiError(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: fieldValidation: {message}',
                           {"group": "meta.k8s.io", "kind": kind, "causes": [
                               {"reason": "FieldValueNotSupported", "message": message, "field": "fieldValidation"}]})
        return cls(value)

    def unknown(self, rt: ResourceType, fields: list[str]) -> None:
        """What the directive does with the unknown ``fields`` of a write (sorted, as the real server lists them)."""
        if not fields or self.directive == "Ignore":
            return
        said = ", ".join(f'unknown field "{f}"' for f in sorted(fields))
        if self.directive == "Warn":
            self.warnings += [f'unknown field "{f}"' for f in sorted(fields)]
            return
        if self.patched is None:
            raise bad_request(f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict '
                              f"decoding error: {said}")
        message = f"Invalid value: {json.dumps(self.patched)}: strict decoding error: {said}"
        raise ApiError(422, "Invalid", f' "" is invalid: patch: {message}',
                       {"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "patch"}]})

    def headers(self) -> list[tuple[str, str]]:
        """The response's ``Warning`` headers (RFC 7234 warn-code 299, agent "-", the text quoted)."""
        return [("Warning", '299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"') for w in self.warnings]


def patched_json(obj: Any) -> str:
    """An object as kube-apiserver encodes the result of a patch in its strict error: compact, keys sorted."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def apply_refusal(rt: ResourceType, body: dict[str, Any], name: str, first_unknown: str) -> ApiError:
    """Server-side apply of a configuration with a field the schema does not declare."""
    meta = body.get("metadata") or {}
    who = f"{meta.get('namespace') or ''}/{meta.get('name') or name}"
    return ApiError(500, "", f"failed to create typed patch object ({who}; {rt.api_version}, Kind={rt.kind}): "
                    f".{first_unknown}: field not declared in schema")
