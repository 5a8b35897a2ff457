"""Server-side printing (meta.k8s.io/v1 Table) so that ``kubectl get`` shows the printer columns."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from ichord.sim.kube.resources import JSON, ResourceType
from ichord.sim.kube.status import bad_request

#: The events table's Object cell: ``kind/name`` of the involved object, the kind in lower case.
_INVOLVED = "involvedObject"
_FILTER = re.compile(r'^\[\?\(@\.([A-Za-z0-9_]+)==["\']([^"\']*)["\']\)\]$')

#: Columns of the built-in kinds kubectl users look at here.
_BUILTIN_COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "events": [("Last Seen", "date", ".lastTimestamp"), ("Type", "string", ".type"),
               ("Reason", "string", ".reason"), ("Object", "string", _INVOLVED),
               ("Message", "string", ".message")],
    "leases": [("Holder", "string", ".spec.holderIdentity"), ("Age", "date", ".metadata.creationTimestamp")],
}
#: Kinds whose table puts Name last and only in ``-o wide`` (priority 1), as the real server's events do.
_NAME_LAST = ("events",)


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


def _involved(obj: JSON) -> str:
    ref = obj.get("involvedObject") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


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
    name_last = rt.plural in _NAME_LAST and not rt.custom
    name_def: JSON = {"name": "Name", "type": "string", "format": "name", "description": "Name",
                      "priority": 1 if name_last else 0}
    defs: list[JSON] = [{"name": n, "type": "string" if t == "date" else t, "format": "", "description": n,
                         "priority": 0} for n, t, _p in columns]
    defs = [*defs, name_def] if name_last else [name_def, *defs]
    rows = []
    for obj in objects:
        cells: list[Any] = []
        for _n, t, p in columns:
            value = _involved(obj) if p == _INVOLVED else jsonpath(obj, p)
            cells.append(age(value, now) if t == "date" else "" if value is None else value)
        name = obj["metadata"]["name"]
        cells = [*cells, name] if name_last else [name, *cells]
        row: JSON = {"cells": cells}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": defs, "rows": rows}
