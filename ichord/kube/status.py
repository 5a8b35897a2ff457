"""The one place status is written: read fresh, compute, patch with the read resourceVersion, retry conflicts.

The patch carries ``metadata.resourceVersion``, so the server refuses it (409) if anything wrote the
object since the read; the mutation then runs again on a fresh read (cluster-api's patch helper
re-applies conditions the same way). Because it applies only to the object as read, the patch carries only what
changed (``merge_diff``): the same result as sending the whole status, without sending, parsing and validating a
large status (a config rollout's operation, ~40 KiB) on every write (docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ichord.jsoncopy import copy_json
from ichord.kube.crds import CustomObjects
from ichord.kube.errors import Conflict, KubeError

log = structlog.get_logger(__name__)

Obj = dict[str, Any]
#: Gets a copy of the object's status (``{}`` when absent) and returns the new status (None: no change).
StatusMutation = Callable[[Obj, Obj], Obj | None]


class ConflictRetriesExhausted(KubeError):
    """Every attempt met a newer object; something else keeps writing it."""

    status, default_reason = 409, "Conflict"


async def update_status(objects: CustomObjects, namespace: str, name: str, mutate: StatusMutation,
                        *, attempts: int = 5, current: Obj | None = None) -> Obj:
    """Apply ``mutate(status, object)`` to the latest object's status; returns the object as written.

    ``current`` (e.g. the informer's copy) saves the first read: it carries its resourceVersion, so a
    stale copy costs one 409 and a fresh read, never a lost update. Nothing is sent when the mutation
    changes nothing. NotFound and other errors propagate.
    """
    fresh = current is None
    for attempt in range(1, attempts + 1):
        if current is None or attempt > 1:
            current, fresh = await objects.get(namespace, name), True
        status = copy_json(current.get("status") or {})
        new = mutate(status, copy_json(current))
        if new is not None:
            _stamp_generation(new, int((current.get("metadata") or {}).get("generation") or 0))
        if new is None or new == (current.get("status") or {}):
            if fresh:
                return current
            continue  # "nothing to change" is only trusted against a fresh read
        patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                 "status": merge_diff(current.get("status") or {}, new)}
        try:
            return await objects.patch_status(namespace, name, patch)
        except Conflict:
            log.info("status conflict, retrying on a fresh read", kind=objects.kind.kind, namespace=namespace,
                     name=name, attempt=attempt)
    raise ConflictRetriesExhausted(
        f"{objects.kind.kind} {namespace}/{name}: status write conflicted {attempts} times; another writer keeps "
        f"changing it", status=409)


def _stamp_generation(status: Obj, generation: int) -> None:
    """Every condition written now without an observedGeneration was computed from this generation (kubectl
    users read it to know a condition is current); conditions carried over keep theirs."""
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and "observedGeneration" not in cond:
            cond["observedGeneration"] = generation


def merge_diff(old: Obj, new: Obj) -> Obj:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: the keys that changed, a key removed as null
    (a ``None`` in ``new`` removes it too), an object by its own difference, a list or a scalar whole."""
    patch: Obj = {}
    for key, value in new.items():
        if key not in old:
            if value is not None:
                patch[key] = value
        elif value is None:
            patch[key] = None
        elif isinstance(value, dict) and isinstance(old[key], dict):
            inner = merge_diff(old[key], value)
            if inner:
                patch[key] = inner
        elif value != old[key]:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch
