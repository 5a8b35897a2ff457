"""Parsing a Kubernetes REST path into (group, version, namespace, resource, name, subresource, verb)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    namespace: str | None
    plural: str
    name: str | None
    subresource: str | None
    verb: str


def _is_watch(query: dict[str, str]) -> bool:
    return query.get("watch", "").lower() in ("1", "true")


def parse(method: str, path: str, query: dict[str, str]) -> Route | None:
    """The resource route of ``path``, or None for a discovery/other path."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    watch_prefix = rest[0] == "watch"  # the legacy /watch/ paths
    if watch_prefix:
        rest = rest[1:]
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if len(rest) > 3:
        return None
    m = method.upper()
    if m == "GET":
        verb = "get" if name else "watch" if (watch_prefix or _is_watch(query)) else "list"
    elif m == "POST":
        verb = "create"
    elif m == "PUT":
        verb = "update"
    elif m == "PATCH":
        verb = "patch"
    elif m == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = m.lower()
    return Route(group, version, namespace, plural, name, sub, verb)
