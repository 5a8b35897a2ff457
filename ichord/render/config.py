"""A Talos machine configuration as a list of YAML documents.

The first document is the v1alpha1 one (``version: v1alpha1``); the others are typed documents
(``apiVersion: v1alpha1``, ``kind: ...``, some with ``name``). Encoding is deterministic: the same
documents always give the same bytes, so a configuration hash compares renders and nodes.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from ichord.errors import IchordError
from ichord.render import fastload, wire

V1ALPHA1 = "v1alpha1"
DocKey = tuple[str, str | None]  # (kind, name); the v1alpha1 document is ("v1alpha1", None)


class ConfigParseError(IchordError):
    pass


def _yaml() -> YAML:
    y = YAML(typ="rt")
    # go-yaml v3 style: 4 spaces per mapping level, sequence dashes indented under their key.
    y.indent(mapping=4, sequence=6, offset=4)
    y.width = 1 << 30
    return y


def _strip_comments(node: Any) -> Any:
    """Plain copy without comments, so encoding never depends on where a document came from."""
    if isinstance(node, dict):
        out = CommentedMap()
        for k, v in node.items():
            out[str(k)] = _strip_comments(v)
        return out
    if isinstance(node, list):
        return [_strip_comments(v) for v in node]
    return node


def doc_key(doc: dict[str, Any]) -> DocKey:
    if "kind" not in doc and doc.get("version") == V1ALPHA1:
        return (V1ALPHA1, None)
    kind = str(doc.get("kind", ""))
    name = doc.get("name")
    return (kind, None if name is None else str(name))


def doc_label(key: DocKey) -> str:
    """``KernelModuleConfig br_netfilter`` / ``KubeAPIServerCAConfig`` / ``v1alpha1``."""
    return key[0] if key[1] is None else f"{key[0]} {key[1]}"


@dataclass
class MachineConfig:
    documents: list[CommentedMap]

    # ---- parsing / encoding --------------------------------------------------------------

    @classmethod
    def parse(cls, data: str | bytes) -> MachineConfig:
        """Parse a configuration as Talos returns it (multi-document YAML, comments allowed)."""
        try:
            docs = [d for d in _yaml().load_all(data) if d is not None]
        except YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise ConfigParseError(f"machine configuration is not valid YAML{where}") from None
        for i, d in enumerate(docs):
            if not isinstance(d, dict):
                raise ConfigParseError(f"document {i + 1} of the machine configuration is not a mapping")
        return cls([_strip_comments(d) for d in docs])

    @classmethod
    def parse_values(cls, data: str | bytes) -> MachineConfig:
        """``parse(data)`` for a reader of values only: plain dicts from libyaml when fastload mirrors ruamel
        (no comments, no ruamel node types), ruamel's parse otherwise; ~20x cheaper. The Talos simulator takes
        applies with it, as machined's Go parser costs next to nothing."""
        try:
            docs = fastload.load_documents(data)
        except fastload.Unsupported:
            return cls.parse(data)
        return cls([cast(CommentedMap, _plain(d)) for d in docs])

    @classmethod
    def plain_of(cls, data: str | bytes) -> list[Any]:
        """``parse(data).plain()``, ~20x faster: libyaml with ruamel's YAML 1.2 resolution (fastload) when the
        document allows it, ruamel itself otherwise, so the result (and a ConfigParseError) is ruamel's."""
        try:
            return [_plain(d) for d in fastload.load_documents(data)]
        except fastload.Unsupported:
            return cls.parse(data).plain()

    def to_yaml(self) -> str:
        y = _yaml()
        parts = []
        for d in self.documents:
            buf = io.StringIO()
            y.dump(d, buf)
            parts.append(buf.getvalue())
        return "---\n".join(parts)

    def to_bytes(self) -> bytes:
        return self.to_yaml().encode()

    def wire_bytes(self) -> bytes:
        """The same values as ``to_bytes`` in libyaml's layout, ~10x cheaper (render/wire.py): what is applied."""
        try:
            return wire.encode(self.plain())
        except wire.WireEncodeError:
            return self.to_bytes()

    def hash(self) -> str:
        """SHA-256 (hex) of the documents as canonical JSON (sorted keys): equal when ``plain()`` is equal.

        Not of the YAML encoding: ruamel's emitter costs ~25 ms for a control plane's configuration, and
        this hash is taken on every machine step (status.configHash). Key order does not change it, as it
        does not change the plain() comparison that decides convergence.
        """
        return plain_hash(self.plain())

    def copy(self) -> MachineConfig:
        return MachineConfig(copy.deepcopy(self.documents))

    def __repr__(self) -> str:
        # Documents hold CA keys and tokens: a repr names them only (dataclass keeps this one).
        return f"MachineConfig(documents=[{', '.join(doc_label(k) for k in self.keys())}])"

    # ---- access --------------------------------------------------------------------------

    @property
    def v1alpha1(self) -> CommentedMap:
        for d in self.documents:
            if doc_key(d) == (V1ALPHA1, None):
                return d
        raise KeyError("the configuration has no v1alpha1 document")

    def find(self, kind: str, name: str | None = None) -> CommentedMap | None:
        for d in self.documents:
            if doc_key(d) == (kind, name) or (name is None and doc_key(d)[0] == kind):
                return d
        return None

    def find_all(self, kind: str) -> Iterator[CommentedMap]:
        return (d for d in self.documents if doc_key(d)[0] == kind)

    def keys(self) -> list[DocKey]:
        return [doc_key(d) for d in self.documents]

    def plain(self) -> list[Any]:
        """The documents as plain dicts/lists (for comparisons and JSON)."""
        return [_plain(d) for d in self.documents]


def plain_hash(plain: list[Any]) -> str:
    """``MachineConfig.hash()`` of documents already in their ``plain()`` form (equal hashes: equal plain forms)."""
    blob = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str):
        return str(node)
    return node
