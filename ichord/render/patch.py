"""Talos config patches, applied the way Talos's configpatcher applies them.

A patch is either a strategic merge patch (one or more YAML documents) or a JSON6902 patch (a
YAML/JSON list of operations), decided as configpatcher.LoadPatch does. Strategic merge:
- a document without ``kind`` is a partial v1alpha1 document and merges into the v1alpha1 one;
  a typed document merges into the document with the same apiVersion, kind and name, or is
  appended when there is none;
- maps merge key by key; a scalar replaces unless it is Go's zero value ("" or 0; false always
  replaces); lists append, except the lists Talos replaces or merges by key (merge.py);
- ``$patch: delete`` removes a document, a key, or the list element matching the element's first
  other key; deletes run before the rest of their document merges. Deleting an unset field of a
  struct that is there is a no-op, as Talos zeroes the field; deleting any other key that does not
  exist (a map key, or under a parent that is not there) is an error (Talos: "lookup failed");
  a delete in a typed document that is not there is a no-op, and the rest of the patch's document
  is appended, as Talos does; deleting the v1alpha1 document is refused.
JSON6902 patches apply to the v1alpha1 document: Talos refuses them on any multi-document
configuration, and every configuration ichord renders has typed documents, so paths address the
v1alpha1 document (``/machine/network/hostname``).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError
from ruamel.yaml.scalarfloat import ScalarFloat
from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

from ichord import yamlio
from ichord.render import jsonpatch, keyorder
from ichord.render.config import V1ALPHA1
from ichord.render.documents import cmap
from ichord.render.errors import PatchError
from ichord.render.merge import MergeConflict, merge

DELETE_KEY = "$patch"
DELETE_VALUE = "delete"
# A document identity: (apiVersion, kind, name); the v1alpha1 document is (None, "v1alpha1", None).
DocId = tuple[str | None, str, str | None]
LEGACY_ID: DocId = (None, V1ALPHA1, None)


@dataclass(frozen=True)
class Delete:
    doc: DocId
    path: tuple[str, ...]  # empty: the whole document
    match: tuple[str, str] | None = None  # list element selector (key, value); path is the list


@dataclass(frozen=True)
class Merge:
    doc: DocId
    content: dict[str, Any] = field(repr=False)  # patch content may hold secrets


@dataclass(frozen=True)
class StrategicPatch:
    label: str
    steps: tuple[Delete | Merge, ...]


@dataclass(frozen=True)
class JSONPatch:
    label: str
    ops: tuple[dict[str, Any], ...] = field(repr=False)


Patch = StrategicPatch | JSONPatch


def doc_id(doc: dict[str, Any]) -> DocId:
    if "kind" not in doc and "apiVersion" not in doc:
        return LEGACY_ID
    name = doc.get("name")
    return (str(doc.get("apiVersion")), str(doc.get("kind")), None if name is None else str(name))


def describe(doc: DocId) -> str:
    if doc == LEGACY_ID:
        return "the v1alpha1 document"
    return f"document {doc[1]}" + (f" {doc[2]}" if doc[2] else "")


# ---- loading --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def load_patch(text: str, label: str) -> Patch:
    """Parse one patch. Cached: patches are immutable once loaded (applying copies their content)."""
    return _load_patch(text, label)


def _load_patch(text: str, label: str) -> Patch:
    try:
        docs = yamlio.load_all(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise PatchError(label, f"is neither valid YAML nor JSON{where}") from None
    if not docs:
        raise PatchError(label, "is empty")
    docs = [_plain_scalars(doc) for doc in docs]
    if len(docs) == 1 and isinstance(docs[0], list):
        return JSONPatch(label, tuple(jsonpatch.validate_ops(docs[0], label)))
    steps: list[Delete | Merge] = []
    seen: set[DocId] = set()
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise PatchError(label, f"document {i + 1} is not a mapping",
                             "write a strategic merge patch (YAML mappings) or a JSON6902 list of operations")
        ident = _identify(doc, label, i)
        if ident in seen:
            raise PatchError(label, f"holds {describe(ident)} twice", "merge the two documents into one")
        seen.add(ident)
        deletes: list[Delete] = []
        if _is_delete_marker(doc):
            if ident == LEGACY_ID:
                raise PatchError(label, "deletes the v1alpha1 document, which every machine configuration needs",
                                 "delete single keys of it instead")
            steps.append(Delete(ident, ()))
            continue
        _collect_deletes(doc, ident, (), deletes, label)
        steps.extend(deletes)
        if ident != LEGACY_ID or any(k != "version" for k in doc):
            # A typed document is never empty (KernelModuleConfig may be just its name); a
            # v1alpha1 one left with only `version` after its deletes merges nothing.
            steps.append(Merge(ident, doc))
    return StrategicPatch(label, tuple(steps))


def _plain_scalars(node: Any) -> Any:
    """Drop the patch's quoting and number formats (keep block scalars), so a rendered configuration
    encodes exactly as its re-parse does (MachineConfig.parse keeps no quoting either)."""
    if isinstance(node, dict):
        out = CommentedMap()
        for k, v in node.items():
            out[_plain_scalars(k)] = _plain_scalars(v)
        return out
    if isinstance(node, list):
        return [_plain_scalars(v) for v in node]
    if isinstance(node, LiteralScalarString | FoldedScalarString):
        return node
    if isinstance(node, str):
        return str(node)
    if isinstance(node, ScalarFloat):
        return float(node)
    if isinstance(node, int) and not isinstance(node, bool):
        return int(node)
    return node


def _identify(doc: dict[str, Any], label: str, i: int) -> DocId:
    where = f"document {i + 1}"
    if "kind" in doc or "apiVersion" in doc:
        if not isinstance(doc.get("kind"), str) or not isinstance(doc.get("apiVersion"), str):
            raise PatchError(label, f"{where} needs both apiVersion and kind", "add the missing one")
        if "version" in doc:
            raise PatchError(label, f"{where} mixes `version` (v1alpha1) with `kind`", "split it in two documents")
        return doc_id(doc)
    version = doc.get("version", V1ALPHA1)
    if version != V1ALPHA1:
        raise PatchError(label, f"{where} has version {version!r}; only v1alpha1 exists",
                         "write version: v1alpha1 or drop the key")
    return LEGACY_ID


def _is_delete_marker(node: Any) -> bool:
    return isinstance(node, dict) and node.get(DELETE_KEY) == DELETE_VALUE


def _collect_deletes(node: dict[str, Any], ident: DocId, path: tuple[str, ...], out: list[Delete],
                     label: str) -> bool:
    """Strip ``$patch: delete`` nodes from ``node`` into ``out``.

    True when ``node`` itself is to go: it is a delete marker, or stripping emptied it (Talos's
    decoder drops containers emptied that way; a mapping written empty stays).
    """
    if DELETE_KEY in node:
        if node[DELETE_KEY] != DELETE_VALUE:
            raise PatchError(label, f"{_dotted(path) or 'a document'} has $patch: {node[DELETE_KEY]!r}",
                             "the only patch directive is `$patch: delete`")
        return True
    removed = False
    for key in list(node):
        value = node[key]
        sub = (*path, str(key))
        if isinstance(value, dict):
            if _is_delete_marker(value):
                out.append(Delete(ident, sub))
                del node[key]
                removed = True
            elif _collect_deletes(value, ident, sub, out, label):
                del node[key]
                removed = True
        elif isinstance(value, list):
            kept = []
            for item in value:
                if _is_delete_marker(item):
                    out.append(Delete(ident, sub, _list_selector(item, sub, label)))
                else:
                    if isinstance(item, dict):
                        _forbid_nested_deletes(item, sub, label)
                    kept.append(item)
            if len(kept) != len(value):
                removed = True
                if kept:
                    node[key] = kept
                else:
                    del node[key]
    return removed and not node


def _list_selector(item: dict[str, Any], path: tuple[str, ...], label: str) -> tuple[str, str]:
    for k, v in item.items():
        if k == DELETE_KEY:
            continue
        if isinstance(v, dict | list):
            break
        return (str(k), "" if v is None else str(v))
    raise PatchError(label, f"a `$patch: delete` element of {_dotted(path)} names no scalar key to match",
                     "write the element's key first, e.g. `- name: PodSecurity` then `$patch: delete`")


def _forbid_nested_deletes(node: dict[str, Any], path: tuple[str, ...], label: str) -> None:
    for k, v in node.items():
        if k == DELETE_KEY or _is_delete_marker(v):
            raise PatchError(label, f"deletes an inner key of a list element under {_dotted(path)}",
                             "Talos cannot delete inside list elements; delete the whole element by its key")
        if isinstance(v, dict):
            _forbid_nested_deletes(v, path, label)
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, dict):
                    _forbid_nested_deletes(item, path, label)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


# ---- applying -------------------------------------------------------------------------------


def apply_patches(documents: list[CommentedMap], patches: list[Patch], *,
                  in_place: bool = False) -> list[CommentedMap]:
    """Apply ``patches`` in order; raises PatchError.

    Works on a copy of ``documents`` unless ``in_place`` (for freshly generated documents the
    caller discards on error), so a failing patch never leaves a half-patched configuration.
    """
    docs = documents if in_place else copy.deepcopy(documents)
    for patch in patches:
        if isinstance(patch, JSONPatch):
            docs = _apply_json(docs, patch)
        else:
            for step in patch.steps:
                if isinstance(step, Delete):
                    docs = _apply_delete(docs, step, patch.label)
                else:
                    _apply_merge(docs, step, patch.label)
    return docs


def touched(patches: list[Patch]) -> set[DocId]:
    """The documents ``patches`` merge into or delete a key of (JSON6902 patches touch the v1alpha1 one)."""
    out: set[DocId] = set()
    for patch in patches:
        if isinstance(patch, JSONPatch):
            out.add(LEGACY_ID)
        else:
            out.update(step.doc for step in patch.steps if isinstance(step, Merge) or step.path)
    return out


def _find(docs: list[CommentedMap], ident: DocId) -> int | None:
    for i, doc in enumerate(docs):
        if doc_id(doc) == ident or (ident == LEGACY_ID and doc.get("version") == V1ALPHA1 and "kind" not in doc):
            return i
    return None


def _apply_delete(docs: list[CommentedMap], step: Delete, label: str) -> list[CommentedMap]:
    idx = _find(docs, step.doc)
    if not step.path:
        # Removing a document that is not there is a no-op: a cluster-wide patch dropping a
        # control-plane document (say KubeFlannelCNIConfig) must also apply to workers.
        return docs if idx is None else [d for i, d in enumerate(docs) if i != idx]
    if idx is None:
        # Talos applies a delete only to a document that is there (StrategicMerge skips it otherwise);
        # the rest of the patch's document is then appended by its merge step.
        return docs
    node: Any = docs[idx]
    parent: Any = None
    for key in step.path[:-1]:
        parent, node = node, node.get(key) if isinstance(node, dict) else None
        if node is None:
            break
    last = step.path[-1]
    if isinstance(node, dict) and last not in node and step.match is None and _unset_struct_field(step):
        # Talos zeroes a struct field whether or not it is set: deleting an unset one is a no-op
        # (a cluster-wide delete of machine.nodeLabels, which workers lack, must apply to them too).
        return docs
    if not isinstance(node, dict) or last not in node:
        raise PatchError(label, f"deletes {_dotted(step.path)} in {describe(step.doc)}, which is not set",
                         "remove the delete")
    if step.match is None:
        del node[last]
        if not node and isinstance(parent, dict) and keyorder.is_map(_kind(step), step.path[:-1]):
            del parent[step.path[-2]]  # an emptied map field is omitted, as Talos's omitempty maps are
        return docs
    items = node[last]
    key, value = step.match
    if isinstance(items, list):
        for i, item in enumerate(items):
            if isinstance(item, dict) and key in item and str(item[key]) == value:
                del items[i]
                if not items:  # an emptied list is omitted, as Talos's omitempty fields are
                    del node[last]
                return docs
    raise PatchError(label, f"deletes the {_dotted(step.path)} element with {key}: {value}, "
                            f"which {describe(step.doc)} does not have", "remove the delete")


def _kind(step: Delete) -> str:
    return V1ALPHA1 if step.doc == LEGACY_ID else str(step.doc[1])


def _unset_struct_field(step: Delete) -> bool:
    """Whether the deleted key is a field of the Go struct its (present) parent mapping decodes into."""
    return step.path[-1] in keyorder.struct_fields(_kind(step), step.path[:-1])


def _apply_merge(docs: list[CommentedMap], step: Merge, label: str) -> None:
    idx = _find(docs, step.doc)
    content = copy.deepcopy(step.content)
    if idx is None:
        if step.doc == LEGACY_ID:
            raise PatchError(label, "patches the v1alpha1 document, which the configuration lacks")
        docs.append(cmap(content))
        return
    try:
        merge(docs[idx], content, step.doc[1])
    except MergeConflict as exc:
        raise PatchError(label, f"{describe(step.doc)}: {_dotted(exc.path)} is a {exc.left} in the configuration "
                                f"but a {exc.right} in the patch", "give the field the type Talos expects") from None


def _apply_json(docs: list[CommentedMap], patch: JSONPatch) -> list[CommentedMap]:
    idx = _find(docs, LEGACY_ID)
    if idx is None:
        raise PatchError(patch.label, "is a JSON6902 patch, and the configuration has no v1alpha1 document")
    result = jsonpatch.apply(docs[idx], patch.ops, patch.label)
    if not isinstance(result, dict) or result.get("version") != V1ALPHA1 or "kind" in result:
        raise PatchError(patch.label, "removes or replaces the v1alpha1 document, which every machine "
                                      "configuration needs", "patch keys inside it instead")
    out = list(docs)
    out[idx] = cmap(result)
    return out
