"""An etcd database file as the simulated etcd's snapshot: bbolt's on-disk format, etcd's buckets, SHA-256 last.

What a real node streams for EtcdSnapshot is etcd's Maintenance.Snapshot: the bbolt file of its backend followed
by the SHA-256 of those bytes (``etcdutl snapshot restore`` checks it). This writes the same shape, small: two meta
pages, an empty freelist, a root leaf naming the buckets, one leaf page per bucket (``cluster``, ``key``,
``members``, ``meta``), keys in order; revisions as etcd encodes them (8-byte big-endian main revision, ``_``,
8-byte sub revision) with ``mvccpb.KeyValue`` values. The real tier holds it to etcd's own tooling
(``etcdutl snapshot status``, which runs bbolt's consistency check), beside a snapshot of the real etcd there.

Only what a simulator needs: every bucket fits one page (``DatabaseTooLarge`` otherwise).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

PAGE_SIZE = 4096
MAGIC = 0xED0CDAED
VERSION = 2
_BRANCH, _LEAF, _META, _FREELIST = 0x01, 0x02, 0x04, 0x10
_BUCKET_LEAF = 0x01
_PAGE_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
_ELEMENT = struct.Struct("<IIII")  # flags, pos (from the element to its key), key size, value size
_BUCKET = struct.Struct("<QQ")  # root page, sequence
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
STORAGE_VERSION = "3.6.0"


class DatabaseTooLarge(ValueError):
    """A bucket's keys and values do not fit one page."""


@dataclass(frozen=True)
class Put:
    """One key as the simulated etcd stores it at a revision."""

    key: bytes
    value: bytes
    revision: int
    create_revision: int = 0
    version: int = 1


def _fnv64a(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= 0xFFFFFFFFFFFFFFFF
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value) if value else b""


def key_value(put: Put) -> bytes:
    """mvccpb.KeyValue: key 1, create_revision 2, mod_revision 3, version 4, value 5."""
    return (_field(1, put.key) + _field(2, put.create_revision or put.revision) + _field(3, put.revision)
            + _field(4, put.version) + _field(5, put.value))


def revision_key(main: int, sub: int = 0) -> bytes:
    return struct.pack(">Q", main) + b"_" + struct.pack(">Q", sub)


def _page(pgid: int, flags: int, count: int, body: bytes) -> bytes:
    data = _PAGE_HEADER.pack(pgid, flags, count, 0) + body
    if len(data) > PAGE_SIZE:
        raise DatabaseTooLarge(f"page {pgid} holds {len(data)} bytes, more than one {PAGE_SIZE}-byte page")
    return data.ljust(PAGE_SIZE, b"\0")


def _leaf(pgid: int, items: Sequence[tuple[bytes, bytes, int]]) -> bytes:
    """A leaf page of (key, value, element flags), keys sorted."""
    items = sorted(items, key=lambda i: i[0])
    elements, data = bytearray(), bytearray()
    data_start = _PAGE_HEADER.size + len(items) * _ELEMENT.size
    for i, (key, value, flags) in enumerate(items):
        element_at = _PAGE_HEADER.size + i * _ELEMENT.size
        elements += _ELEMENT.pack(flags, data_start + len(data) - element_at, len(key), len(value))
        data += key + value
    return _page(pgid, _LEAF, len(items), bytes(elements + data))


def _meta(pgid: int, *, root: int, freelist: int, high_water: int, txid: int) -> bytes:
    fields = struct.pack("<IIII", MAGIC, VERSION, PAGE_SIZE, 0) + _BUCKET.pack(root, 0) + struct.pack(
        "<QQQ", freelist, high_water, txid)
    return _page(pgid, _META, 0, fields + struct.pack("<Q", _fnv64a(fields)))


def database(buckets: dict[bytes, list[tuple[bytes, bytes]]], *, txid: int = 2) -> bytes:
    """A bbolt file holding ``buckets`` (name -> key/value pairs), one leaf page each."""
    names = sorted(buckets)
    root_page, first_bucket = 3, 4
    high_water = first_bucket + len(names)
    pages = [
        _meta(0, root=root_page, freelist=2, high_water=high_water, txid=txid - 1),
        _meta(1, root=root_page, freelist=2, high_water=high_water, txid=txid),
        _page(2, _FREELIST, 0, b""),
        _leaf(root_page, [(name, _BUCKET.pack(first_bucket + i, 0), _BUCKET_LEAF) for i, name in enumerate(names)]),
    ]
    pages += [_leaf(first_bucket + i, [(k, v, 0) for k, v in buckets[name]]) for i, name in enumerate(names)]
    return b"".join(pages)


@dataclass(frozen=True)
class Member:
    name: str
    member_id: int
    peer_url: str
    client_url: str


def snapshot(members: Sequence[Member], puts: Sequence[Put], *, term: int, consistent_index: int) -> bytes:
    """An etcd snapshot: the database of ``members`` and ``puts``, then its SHA-256 (Maintenance.Snapshot's form)."""
    key_bucket = [(revision_key(p.revision), key_value(p)) for p in puts]
    member_bucket = [(f"{m.member_id:x}".encode(), json.dumps(
        {"id": m.member_id, "peerURLs": [m.peer_url], "name": m.name, "clientURLs": [m.client_url]},
        separators=(",", ":")).encode()) for m in members]
    meta = [(b"consistent_index", struct.pack(">Q", consistent_index)), (b"term", struct.pack(">Q", term)),
            (b"storageVersion", STORAGE_VERSION.encode())]
    db = database({b"cluster": [(b"clusterVersion", STORAGE_VERSION.encode())], b"key": key_bucket,
                   b"members": member_bucket, b"meta": meta})
    return db + hashlib.sha256(db).digest()
