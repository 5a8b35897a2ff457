"""Chunked lists (``limit`` and ``continue``) as kube-apiserver pages them.

A page holds at most ``limit`` items in key order; its metadata carries an opaque ``continue`` token
(the key to start after, and the list's resourceVersion) and, without a selector, ``remainingItemCount``. A token that
does not decode is a 400. The simulator keeps every revision, so a continued list is never 410.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from ichord.sim.kube.resources import JSON
from ichord.sim.kube.status import bad_request


def _key(item: JSON) -> str:
    meta = item.get("metadata") or {}
    return f"/{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _start_after(q: Mapping[str, str]) -> str | None:
    token = q.get("continue")
    if not token:
        return None
    try:
        return str(json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion (version "
                          "meta.k8s.io/v1)") from None


def _window(items: list[JSON], q: Mapping[str, str]) -> tuple[list[JSON], int]:
    """The page and how many items follow it."""
    start = _start_after(q)
    rest = [i for i in items if start is None or _key(i) > start]
    try:
        limit = int(q.get("limit") or 0)
    except ValueError:
        limit = 0
    if limit <= 0 or limit >= len(rest):
        return rest, 0
    return rest[:limit], len(rest) - limit


def page(items: list[JSON], q: Mapping[str, str]) -> list[JSON]:
    return _window(items, q)[0]


def page_metadata(rv: int, items: list[JSON], q: Mapping[str, str]) -> dict[str, Any]:
    shown, remaining = _window(items, q)
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if remaining:
        token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": _key(shown[-1])}).encode()
        meta["continue"] = base64.urlsafe_b64encode(token).decode().rstrip("=")
        if not q.get("labelSelector") and not q.get("fieldSelector"):  # a selector's count is unknown ahead
            meta["remainingItemCount"] = remaining
    return meta
