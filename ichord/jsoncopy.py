"""A deep copy for JSON values (dicts, lists, scalars): the simulator store's hand-outs and watch events, and the
daemon's copies of API objects (a status write's working copy, read-your-writes, the operations a step is handed).

``copy.deepcopy`` keeps a memo of every object it visits, for cycles and shared references that JSON values never
have; on the objects a wide pass writes (a TalosOperation's status with a hundred machine entries) it was the
simulator's largest cost after TLS, and the daemon's largest in a config rollout's steps (every worker's marker
write copied the whole operation twice). This walks dicts and lists only; any other container falls back to
``copy.deepcopy``, so a value that is not plain JSON is still copied, never shared.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

T = TypeVar("T")

_SCALARS = (str, int, float, bool, type(None))


def copy_json(value: T) -> T:
    """A copy of ``value`` sharing nothing mutable with it."""
    return _copy(value)  # type: ignore[no-any-return]


def _copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _copy(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else _copy(v) for v in value]
    if kind in _SCALARS:
        return value
    return copy.deepcopy(value)
