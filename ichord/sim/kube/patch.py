"""The three patch types of the API server: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge.

Strategic merge covers what ichord and kubectl send: maps merge, ``null`` deletes, lists named by a
patch merge key (containers, env, volumes, ports, conditions, ...) merge by that key, ``$patch:
delete``/``replace`` directives; every other list is replaced.
"""

from __future__ import annotations

import copy
from typing import Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

#: Lists merged by key in strategic merge (field name -> merge key), from the built-in types' tags.
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort", "conditions": "type",
    "imagePullSecrets": "name", "tolerations": "key", "hostAliases": "ip", "taints": "key",
    "ownerReferences": "uid", "addresses": "type",
}


class PatchError(ValueError):
    """The patch cannot be applied (the server answers 422 or 400)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        directive = patch.get("$patch")
        if directive == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if directive == "delete":
            return None
        result = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            if value is None:
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value, key)
        return result
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(target, list):
        return _merge_list(target, patch, MERGE_KEYS[field])
    return copy.deepcopy(patch)


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {key}")
        index = next((i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item[key]),
                     None)
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
            continue
        if index is None:
            result.append(strategic_merge_patch(None, item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                raise PatchError(f"path /{'/'.join(parts)} does not exist")
            doc = doc[part]
        elif isinstance(doc, list):
            doc = doc[_index(doc, part, allow_end=False)]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return doc


def _index(lst: list[Any], part: str, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(lst)
    try:
        i = int(part)
    except ValueError:
        raise PatchError(f"invalid array index {part!r}") from None
    if i < 0 or i > len(lst) or (i == len(lst) and not allow_end):
        raise PatchError(f"array index {i} out of bounds")
    return i


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, allow_end=True), value)
    else:
        raise PatchError(f"cannot add to {parts}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, allow_end=False))
    raise PatchError(f"cannot remove from {parts}")


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _walk(doc, parts)  # must exist
            if parts:
                _remove(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_walk(doc, source))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise PatchError(f"testing value {op['path']} failed")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc
