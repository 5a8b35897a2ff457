"""Server-side printing (meta.k8s.io/v1 Table) so that ``kubectl get`` shows the printer columns."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.status import bad_request

_FILTER = re.compile(r'^\[\?\(@\.([A-Za-z0-9_]+)==["\']([^"\']*)["\']\)\]$')

#: Columns of the built-in kinds kubectl users look at here.
_BUILTIN_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "events": [("Last Seen", "date", ".lastTimestamp"), ("Type", "string", ".type"),
               ("Reason", "string", ".reason"), ("Object", "string", ".involvedObject.name"),
               ("Message", "string", ".message")],
    "leases": [("Holder", "string", ".spec.holderIdentity"), ("Age", "date", ".metadata.creationTimestamp")],
}


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: ``.a.b`` and ``.a[?(@.k=="v")].b``."""
    cur: list[Any] = [obj]
    for token in re.findall(r"\.[A-Za-z0-9_-]+|\[[^\]]*\]", path):
        nxt: list[Any] = []
        for item in cur:
            if token.startswith("."):
                if isinstance(item, dict) and token[1:] in item:
                    nxt.append(item[token[1:]])
            else:
                m = _FILTER.match(token)
                if m and isinstance(item, list):
                    nxt.extend(e for e in item if isinstance(e, dict) and str(e.get(m.group(1))) == m.group(2))
        cur = nxt
    return cur[0] if cur else None


def age(stamp: str | None, now: dt.datetime) -> str:
    if not stamp:
        return "<unknown>"
    try:
        then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    secs = max(0, int((now - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _columns(rt: ResourceType) -> list[tuple[str, str, str]]:
    if rt.printer_columns:
        return [(c["name"], c.get("type", "string"), c["jsonPath"]) for c in rt.printer_columns]
    return _BUILTIN_COLUMNS.get(rt.plural, [("Age", "date", ".metadata.creationTimestamp")])


def table(rt: ResourceType, objects: list[JSON], rv: int, now: dt.datetime,
          include_object: str | None = None) -> JSON:
    """A Table of ``objects``; each row carries the object as ``includeObject`` asks (default Metadata:
    kubectl's ``--sort-by`` and ``-o`` with a Table ask for the whole Object)."""
    if include_object not in (None, "", "None", "Metadata", "Object"):
        raise bad_request(f"includeObject must be None, Metadata or Object, not {include_object!r}")
    columns = _columns(rt)
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    defs += [{"name": n, "type": "string" if t == "date" else t, "format": "", "description": n, "priority": 0}
             for n, t, _p in columns]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        for _n, t, p in columns:
            value = jsonpath(obj, p)
            cells.append(age(value, now) if t == "date" else "" if value is None else value)
        row: JSON = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": defs, "rows": rows}
