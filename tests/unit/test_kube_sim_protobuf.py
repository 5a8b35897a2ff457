"""The simulator's protobuf request decoding (ichord/sim/kube/protobuf.py) on hand-built bodies; the
real kubectl's bodies are covered by tests/integration/test_kube_kubectl.py."""

from __future__ import annotations

import pytest

from ichord.sim.kube import protobuf
from ichord.sim.kube.status import ApiError


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, value: bytes | int) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return protobuf.MAGIC + _field(1, type_meta) + _field(2, raw)


def test_secret_with_maps_pointer_false_and_zero_values_dropped() -> None:
    meta = (_field(1, b"s") + _field(2, b"") + _field(3, b"ns") + _field(8, b"")
            + _field(11, _field(1, b"app") + _field(2, b"x")))
    raw = (_field(1, meta) + _field(2, _field(1, b"k") + _field(2, b"\x00\xff")) + _field(3, b"Opaque")
           + _field(5, 0))
    assert protobuf.decode(_envelope("v1", "Secret", raw)) == {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "ns", "labels": {"app": "x"}},
        "data": {"k": "AP8="}, "type": "Opaque", "immutable": False}


def test_timestamps_and_repeated_fields() -> None:
    meta = _field(1, b"n") + _field(8, _field(1, 1767225600)) + _field(14, b"a") + _field(14, b"b")
    obj = protobuf.decode(_envelope("v1", "Namespace", _field(1, meta)))
    assert obj["metadata"] == {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a", "b"]}


@pytest.mark.parametrize(("body", "code", "text"), [
    (b'{"kind": "Secret"}', 415, "no k8s protobuf envelope"),
    (_envelope("apps/v1", "Deployment", b""), 415, "kind apps/v1/Deployment"),
    (_envelope("v1", "Secret", _field(9, b"x")), 415, "field 9"),
    (_envelope("v1", "Secret", b"\x0a\x05ab"), 400, "truncated"),
])
def test_what_it_cannot_decode_is_refused(body: bytes, code: int, text: str) -> None:
    with pytest.raises(ApiError) as refused:
        protobuf.decode(body)
    assert refused.value.code == code and text in refused.value.message
