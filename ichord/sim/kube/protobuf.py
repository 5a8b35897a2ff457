"""Request bodies in Kubernetes' protobuf encoding (``application/vnd.kubernetes.protobuf``), as JSON.

kubectl's typed clients (``kubectl create namespace|secret|configmap|serviceaccount``) send built-in
objects as protobuf and do not fall back to JSON on 415, so the simulator decodes them: the
``k8s\\x00`` envelope (runtime.Unknown), then the object with the field numbers of k8s.io/api's
generated.proto for the kinds below. Zero values are dropped as JSON's omitempty drops them;
pointer fields (``?`` below) keep an explicit false/0. A kind or field outside this table is
refused with 415 so that nothing is silently lost.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

from ichord.sim.kube.status import ApiError

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

JSON = dict[str, Any]
#: field number -> (JSON name, kind); kind is a scalar name, "map", "bytesmap" or a nested schema,
#: with "[]" for repeated fields and "?" for pointer fields whose zero value is kept.
Schema = dict[int, tuple[str, Any]]

_TIME: Schema = {1: ("seconds", "int"), 2: ("nanos", "int")}
_OWNER_REFERENCE: Schema = {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                            5: ("apiVersion", "string"), 6: ("controller", "bool?"),
                            7: ("blockOwnerDeletion", "bool?")}
_OBJECT_META: Schema = {
    1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"), 4: ("selfLink", "string"),
    5: ("uid", "string"), 6: ("resourceVersion", "string"), 7: ("generation", "int"),
    8: ("creationTimestamp", "time"), 9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", "int?"), 11: ("labels", "map"), 12: ("annotations", "map"),
    13: ("ownerReferences", [_OWNER_REFERENCE]), 14: ("finalizers", ["string"]),
}
_OBJECT_REFERENCE: Schema = {1: ("kind", "string"), 2: ("namespace", "string"), 3: ("name", "string"),
                             4: ("uid", "string"), 5: ("apiVersion", "string"),
                             6: ("resourceVersion", "string"), 7: ("fieldPath", "string")}

#: (apiVersion, kind) -> schema of the object after its TypeMeta.
KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", ["string"])}),
                          3: ("status", {1: ("phase", "string")})},
    ("v1", "Secret"): {1: ("metadata", _OBJECT_META), 2: ("data", "bytesmap"), 3: ("type", "string"),
                       4: ("stringData", "map"), 5: ("immutable", "bool?")},
    ("v1", "ConfigMap"): {1: ("metadata", _OBJECT_META), 2: ("data", "map"), 3: ("binaryData", "bytesmap"),
                          4: ("immutable", "bool?")},
    ("v1", "ServiceAccount"): {1: ("metadata", _OBJECT_META), 2: ("secrets", [_OBJECT_REFERENCE]),
                               3: ("imagePullSecrets", [{1: ("name", "string")}]),
                               4: ("automountServiceAccountToken", "bool?")},
}
_UNKNOWN: Schema = {1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
                    2: ("raw", "raw"), 3: ("contentEncoding", "string"), 4: ("contentType", "string")}


def is_protobuf(content_type: str) -> bool:
    return content_type.split(";", maxsplit=1)[0].strip().lower() == CONTENT_TYPE


def unsupported(why: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f"the ichord simulator cannot decode this protobuf body ({why}); "
                    f"send application/json")


def decode(body: bytes) -> JSON:
    """The JSON object a protobuf request body carries (415 for what the table above does not cover)."""
    if not body.startswith(MAGIC):
        raise unsupported("no k8s protobuf envelope")
    envelope = _message(body[len(MAGIC):], _UNKNOWN)
    if envelope.get("contentEncoding"):
        raise unsupported(f"content encoding {envelope['contentEncoding']}")
    type_meta = envelope.get("typeMeta", {})
    api_version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
    schema = KINDS.get((api_version, kind))
    if schema is None:
        raise unsupported(f"kind {api_version}/{kind}")
    obj = _message(envelope.get("raw", b""), schema)
    return {"apiVersion": api_version, "kind": kind, **obj}


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise _truncated()
            yield number, wire, data[pos:pos + size]
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, wire, int.from_bytes(data[pos:pos + width], "little")
            pos += width
        else:
            raise unsupported(f"wire type {wire}")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _truncated()
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _truncated() -> ApiError:
    return ApiError(400, "BadRequest", "the protobuf request body is truncated")


def _message(data: bytes, schema: Schema) -> JSON:
    out: JSON = {}
    for number, wire, value in _fields(data):
        if number not in schema:
            raise unsupported(f"field {number}")
        name, kind = schema[number]
        if isinstance(kind, list):
            item = _value(kind[0], wire, value)
            out.setdefault(name, []).append(item)
        elif kind in ("map", "bytesmap"):
            entry = _message(_bytes(value), {1: ("key", "string"), 2: ("value", "raw")})
            raw = entry.get("value", b"")
            out.setdefault(name, {})[entry.get("key", "")] = (
                raw.decode() if kind == "map" else base64.b64encode(raw).decode())
        else:
            out[name] = _value(kind, wire, value)
    return {k: v for k, v in out.items() if not _omitted(schema, k, v)}


def _omitted(schema: Schema, name: str, value: Any) -> bool:
    kind = next(k for n, k in schema.values() if n == name)
    return not (isinstance(kind, str) and kind.endswith("?")) and value in ("", 0, False, None, {}, [])


def _value(kind: Any, wire: int, value: int | bytes) -> Any:
    if isinstance(kind, dict):
        return _message(_bytes(value), kind)
    if kind == "string":
        return _bytes(value).decode()
    if kind == "raw":
        return _bytes(value)
    if kind == "time":
        stamp = _message(_bytes(value), _TIME)
        if not stamp:
            return None
        when = dt.datetime.fromtimestamp(stamp.get("seconds", 0), dt.UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    if kind in ("int", "int?"):
        number = _int(wire, value)
        return number - (1 << 64) if number >= 1 << 63 else number
    if kind == "bool?":
        return bool(_int(wire, value))
    raise unsupported(f"field kind {json.dumps(kind)}")


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise ApiError(400, "BadRequest", "the protobuf request body has a number where bytes belong")
    return value


def _int(wire: int, value: int | bytes) -> int:
    if not isinstance(value, int) or wire not in (0, 1, 5):
        raise ApiError(400, "BadRequest", "the protobuf request body has bytes where a number belongs")
    return value
