"""Leaf-level difference between two Talos machine configurations.

Documents are matched by (kind, name), never by position, so reordering documents is no change.
Inside a document every changed leaf is one ``Change`` (lists by index); a document added or
removed whole is ONE change labelled with the document, which still carries its leaf paths so
that fieldmeta can classify what the document holds. Values are never kept: labels and reasons
end up in statuses and events, and values may be keys or tokens.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ichord.errors import IchordError
from ichord.render.config import V1ALPHA1, DocKey, MachineConfig, doc_key, doc_label

Segment = str | int
FieldPath = tuple[Segment, ...]

# Keys that identify a document (its match key): they never differ between matched documents.
_MATCH_KEYS = {True: frozenset({"version"}), False: frozenset({"kind", "name"})}
# The header of a document: a document added or removed whole is not classified by these (an
# apiVersion bump of a matched document is still a change).
_HEADER_KEYS = {True: frozenset({"version"}), False: frozenset({"apiVersion", "kind", "name"})}
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigDiffError(IchordError):
    pass


class Op(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"
    MODIFIED = "modified"


@dataclass(frozen=True)
class Change:
    """One changed leaf, or one document added/removed whole (``path == ()``)."""

    document: DocKey
    path: FieldPath
    op: Op
    #: For a whole document: the field paths it carries (classified, never reported).
    leaves: tuple[FieldPath, ...] = field(default=(), compare=False)

    @property
    def whole_document(self) -> bool:
        return self.path == () and self.op is not Op.MODIFIED

    @property
    def kind(self) -> str:
        return self.document[0]

    @property
    def label(self) -> str:
        """``.machine.certSANs[1]``, ``KubeletConfig.image``, ``KernelModuleConfig br_netfilter (added)``."""
        if self.whole_document:
            return f"{doc_label(self.document)} ({self.op.value})"
        return format_path(self.document, self.path)


def format_path(document: DocKey, path: FieldPath) -> str:
    """The dotted path of a field: ``.machine.x`` in v1alpha1, ``Kind name.x`` in typed documents."""
    parts: list[str] = []
    for seg in path:
        if isinstance(seg, int):
            parts.append(f"[{seg}]")
        elif _PLAIN_KEY.match(seg):
            parts.append(f".{seg}")
        else:
            # Sysctl names and label keys carry dots and slashes: quote them so the path stays unambiguous.
            parts.append(f"[{json.dumps(seg)}]")
    tail = "".join(parts)
    if document == (V1ALPHA1, None):
        return tail or "."
    return doc_label(document) + tail


def diff(old: MachineConfig, new: MachineConfig) -> list[Change]:
    """Every change from ``old`` to ``new``: the v1alpha1 document first, then documents in
    ``new``'s order, then documents only ``old`` has in its order; keys in ``new``'s order, then
    keys only ``old`` has. The same two configurations always give the same list."""
    old_docs = _index(old, "old")
    new_docs = _index(new, "new")
    order: list[DocKey] = []
    v1 = (V1ALPHA1, None)
    if v1 in old_docs or v1 in new_docs:
        order.append(v1)
    order += [k for k in new_docs if k != v1]
    order += [k for k in old_docs if k != v1 and k not in new_docs]

    changes: list[Change] = []
    for key in order:
        is_v1 = key == v1
        if key in old_docs and key in new_docs:
            ids = _MATCH_KEYS[is_v1]
            changes.extend(_walk_keys(key, (), _without(old_docs[key], ids), _without(new_docs[key], ids)))
        else:
            present = new_docs[key] if key in new_docs else old_docs[key]
            op = Op.ADDED if key in new_docs else Op.REMOVED
            leaves = tuple(_leaves((), _without(present, _HEADER_KEYS[is_v1])))
            changes.append(Change(key, (), op, leaves))
    return changes


def _index(config: MachineConfig, which: str) -> dict[DocKey, dict[str, Any]]:
    out: dict[DocKey, dict[str, Any]] = {}
    for doc in config.documents:
        key = doc_key(doc)
        if key in out:
            raise ConfigDiffError(
                f"the {which} configuration holds two {doc_label(key)} documents; Talos refuses that, "
                "so remove the duplicate (check the patches) before comparing"
            )
        out[key] = _normalize(doc)
    return out


def _without(doc: Mapping[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in keys}


def _normalize(node: Any) -> Any:
    """Plain Python values: a block scalar and a quoted string, or ``0o644`` and ``420``, compare by value."""
    if isinstance(node, Mapping):
        return {str(k): _normalize(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_normalize(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node  # timestamps and other YAML scalars compare as loaded


def _walk(doc: DocKey, path: FieldPath, a: Any, b: Any) -> Iterator[Change]:
    if isinstance(a, dict) and isinstance(b, dict) and (a or b):
        yield from _walk_keys(doc, path, a, b)
    elif isinstance(a, list) and isinstance(b, list) and (a or b):
        for i in range(max(len(a), len(b))):
            yield from _pair(doc, (*path, i), a[i] if i < len(a) else None, b[i] if i < len(b) else None)
    elif type(a) is not type(b) or a != b:
        yield Change(doc, path, Op.MODIFIED)


def _walk_keys(doc: DocKey, path: FieldPath, a: Mapping[str, Any], b: Mapping[str, Any]) -> Iterator[Change]:
    keys = list(b) + [k for k in a if k not in b]
    for k in keys:
        yield from _pair(doc, (*path, k), a.get(k), b.get(k))


def _pair(doc: DocKey, path: FieldPath, a: Any, b: Any) -> Iterator[Change]:
    # A null value and a missing key mean the same to Talos (Go omitempty): no change.
    if a is None and b is None:
        return
    if a is None:
        yield from (Change(doc, p, Op.ADDED) for p in _leaves(path, b))
    elif b is None:
        yield from (Change(doc, p, Op.REMOVED) for p in _leaves(path, a))
    else:
        yield from _walk(doc, path, a, b)


def _leaves(path: FieldPath, node: Any) -> Iterator[FieldPath]:
    """Paths of the leaves under ``node``; an empty mapping or list is a leaf itself."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves((*path, k), v)
    elif isinstance(node, list) and node:
        for i, v in enumerate(node):
            yield from _leaves((*path, i), v)
    elif node is not None:
        yield path
