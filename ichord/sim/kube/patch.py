"""The three patch types of the API server: JSON merge (RFC 7386), JSON patch (RFC 6902), strategic merge.

Strategic merge covers what ichord and kubectl send: maps merge, ``null`` deletes, lists named by a
patch merge key (containers, env, volumes, ports, conditions, ...) merge by that key, ``$patch:
delete``/``replace`` directives; every other list is replaced.
"""

from __future__ import annotations

from typing import Any

from ichord.jsoncopy import copy_json
from ichord.render import jsonpatch as _jsonpatch
from ichord.render.errors import PatchError as RenderPatchError

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
    """RFC 7386 merge patch of ``target`` (not changed) by ``patch``: a new value sharing nothing with either."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    # One copy of the target, then the patch applied to it in place: copying at every level of the recursion copied
    # each subtree once per level above it (the sim's largest cost in a config rollout's status writes).
    return _merge_into(copy_json(target) if isinstance(target, dict) else {}, patch)


def _merge_into(result: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            result[key] = _merge_into(current if isinstance(current, dict) else {}, value)
        else:
            result[key] = copy_json(value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        directive = patch.get("$patch")
        if directive == "replace":
            return {k: copy_json(v) for k, v in patch.items() if k != "$patch"}
        if directive == "delete":
            return None
        result = copy_json(target) if isinstance(target, dict) else {}
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
    return copy_json(patch)


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = copy_json(target)
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


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 as kube-apiserver applies it: ichord's one implementation (ichord.render.jsonpatch), with the
    API server's leniency on a missing object member (tests/real/test_sim_differential.py): ``replace`` of
    one adds it (``remove`` of one fails). Errors become the API's 422."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    try:
        doc = target
        for op in _jsonpatch.validate_ops(ops, "the JSON patch"):
            missing = op["op"] == "replace" and _missing_member(doc, op["path"])
            lenient = {**op, "op": "add"} if missing else op
            doc = _jsonpatch.apply(doc, (lenient,), "the JSON patch")
        return doc
    except RenderPatchError as exc:
        raise PatchError(str(exc)) from None


def _missing_member(doc: Any, path: str) -> bool:
    """True when ``path`` names an absent key of an object that exists."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")] if path else []
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return bool(parts) and isinstance(node, dict) and parts[-1] not in node
