"""Server-side apply (``application/apply-patch+yaml``) as kube-apiserver answers it, in the small.

Each field manager owns the leaf fields of the configuration it last applied. Applying merges the
configuration into the object (maps merge; lists and scalars are leaves, replaced whole), removes
the fields the manager applied before and no longer applies (unless another manager owns them),
and refuses with 409 Conflict a leaf another manager owns with a different value, unless forced
(then ownership moves). Missing object: apply creates it (201).

Deliberately smaller than the real structured-merge-diff (said in the simulator's docs): ownership is
tracked for Apply managers only (a plain update or patch takes no ownership), lists are atomic
(no merge by key), and ``metadata.managedFields`` is not shown on objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ichord.jsoncopy import copy_json
from ichord.sim.kube.status import ApiError

Path = tuple[str, ...]

#: Identity fields every applied configuration carries; nobody owns them.
_IDENTITY: frozenset[Path] = frozenset({("apiVersion",), ("kind",), ("metadata", "name"),
                                        ("metadata", "namespace"), ("metadata", "resourceVersion")})


def leaves(value: Any, prefix: Path = ()) -> dict[Path, Any]:
    """The leaf fields of ``value``: every non-map value (and every empty map) by its path."""
    if isinstance(value, dict) and value:
        out: dict[Path, Any] = {}
        for key, sub in value.items():
            out.update(leaves(sub, (*prefix, str(key))))
        return out
    return {prefix: value}


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _remove(obj: dict[str, Any], path: Path) -> None:
    parents = [obj]
    for key in path[:-1]:
        nxt = parents[-1].get(key)
        if not isinstance(nxt, dict):
            return
        parents.append(nxt)
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):  # maps the removal emptied go too
        if parents[depth] == {}:
            parents[depth - 1].pop(path[depth - 1], None)


def _merge(target: Any, config: Any) -> Any:
    if isinstance(target, dict) and isinstance(config, dict):
        out = copy_json(target)
        for key, value in config.items():
            out[key] = _merge(out.get(key), value)
        return out
    return copy_json(config)


class _Absent:
    pass


_ABSENT = _Absent()


@dataclass
class Owners:
    """Per object (by uid): manager -> the leaf paths it applied."""

    by_manager: dict[str, set[Path]] = field(default_factory=dict)


def conflict_error(conflicts: list[tuple[Path, str]]) -> ApiError:
    shown = [("." + ".".join(path), manager) for path, manager in conflicts]
    if len(shown) == 1:
        message = f'Apply failed with 1 conflict: conflict with "{shown[0][1]}": {shown[0][0]}'
    else:
        managers = sorted({m for _p, m in shown})
        lines = "\n".join(f"- {p}" for p, _m in shown)
        who = ", ".join(f'"{m}"' for m in managers)
        message = f"Apply failed with {len(shown)} conflicts: conflicts with {who}:\n{lines}"
    causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": p} for p, m in shown]
    return ApiError(409, "Conflict", message, {"causes": causes})


def apply(current: dict[str, Any] | None, config: dict[str, Any], manager: str, force: bool,
          owners: Owners) -> dict[str, Any]:
    """The object after ``manager`` applies ``config`` to ``current`` (None: it does not exist yet); updates
    ``owners``. Raises the 409 ApiError on a conflict that is not forced."""
    applied = {p: v for p, v in leaves(config).items() if p not in _IDENTITY and p[:1] != ("status",)}
    base = current or {}
    conflicts: list[tuple[Path, str]] = []
    for path, value in applied.items():
        for other, paths in owners.by_manager.items():
            if other != manager and path in paths and _get(base, path) != value:
                conflicts.append((path, other))
    if conflicts and not force:
        raise conflict_error(sorted(conflicts))
    for other, paths in owners.by_manager.items():
        if other != manager:
            paths.difference_update(applied)
    result: dict[str, Any] = _merge(base, {k: v for k, v in config.items() if k != "status"})
    previously = owners.by_manager.get(manager, set())
    still_owned: set[Path] = set()
    for other, paths in owners.by_manager.items():
        if other != manager:
            still_owned |= paths
    for path in previously - set(applied) - still_owned:
        _remove(result, path)
    owners.by_manager[manager] = set(applied)
    return result
