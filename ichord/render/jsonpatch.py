"""RFC 6902 JSON Patch over YAML trees (mappings and lists), as configpatcher's JSON6902 applies it."""

from __future__ import annotations

import copy
from typing import Any

from ichord.render.errors import PatchError

OPS = ("add", "remove", "replace", "move", "copy", "test")


def validate_ops(ops: list[Any], label: str) -> list[dict[str, Any]]:
    if not ops:
        raise PatchError(label, "is an empty JSON6902 list")
    out = []
    for i, op in enumerate(ops):
        where = f"operation {i + 1}"
        if not isinstance(op, dict) or op.get("op") not in OPS:
            raise PatchError(label, f"{where} is not a JSON6902 operation (op must be one of {', '.join(OPS)})")
        if not isinstance(op.get("path"), str):
            raise PatchError(label, f"{where} ({op['op']}) has no path")
        if op["op"] in ("add", "replace", "test") and "value" not in op:
            raise PatchError(label, f"{where} ({op['op']} {op['path']}) has no value")
        if op["op"] in ("move", "copy") and not isinstance(op.get("from"), str):
            raise PatchError(label, f"{where} ({op['op']} {op['path']}) has no from")
        _pointer(op["path"], label, where)
        out.append(dict(op))
    return out


def _pointer(path: str, label: str, where: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(label, f"{where}: path {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def apply(doc: Any, ops: tuple[dict[str, Any], ...], label: str) -> Any:
    """Apply ``ops`` to a copy of ``doc``; every failure names the operation."""
    root = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        where = f"operation {i + 1} ({op['op']} {op['path']})"
        try:
            root = _apply_one(root, op, label, where)
        except _Fail as exc:
            raise PatchError(label, f"{where}: {exc}", "check the path against the rendered configuration") from None
    return root


class _Fail(Exception):
    pass


def _apply_one(root: Any, op: dict[str, Any], label: str, where: str) -> Any:
    path = _pointer(op["path"], label, where)
    kind = op["op"]
    if kind == "test":
        if _get(root, path) != op["value"]:
            raise _Fail("the value differs")
        return root
    if kind == "remove":
        return _remove(root, path)
    if kind == "replace":
        _get(root, path)  # must exist
        return _add(root, path, copy.deepcopy(op["value"]), replace=True)
    if kind == "add":
        return _add(root, path, copy.deepcopy(op["value"]), replace=False)
    source = _pointer(op["from"], label, where)
    value = copy.deepcopy(_get(root, source))
    if kind == "move":
        if path[: len(source)] == source and len(path) > len(source):
            raise _Fail("cannot move a value into itself")
        root = _remove(root, source)
    return _add(root, path, value, replace=False)


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":  # noqa: S105 - JSON pointer "end of list", not a secret
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise _Fail(f"{token!r} is not a list index")
    i = int(token)
    if i > len(container) or (not for_add and i == len(container)):
        raise _Fail(f"index {i} is out of range")
    return i


def _get(root: Any, path: list[str]) -> Any:
    node = root
    for token in path:
        if isinstance(node, dict):
            if token not in node:
                raise _Fail(f"{token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise _Fail(f"{token!r} is below a scalar")
    return node


def _add(root: Any, path: list[str], value: Any, *, replace: bool) -> Any:
    if not path:
        return value
    parent = _get(root, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        i = _index(parent, last, for_add=not replace)
        if replace:
            parent[i] = value
        else:
            parent.insert(i, value)
    else:
        raise _Fail(f"{last!r} is below a scalar")
    return root


def _remove(root: Any, path: list[str]) -> Any:
    if not path:
        return None
    parent = _get(root, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _Fail(f"{last!r} does not exist")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, for_add=False)]
    else:
        raise _Fail(f"{last!r} is below a scalar")
    return root
