"""Label and field selectors, with the API server's syntax and its refusals."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ichord.sim.kube.status import bad_request

JSON = dict[str, Any]
Predicate = Callable[[JSON], bool]

#: Field labels the server accepts per resource (besides metadata.name and metadata.namespace).
FIELD_LABELS: dict[str, frozenset[str]] = {
    "pods": frozenset({"spec.nodeName", "status.phase", "spec.serviceAccountName"}),
    "events": frozenset({"involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                         "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"}),
    "secrets": frozenset({"type"}),
    "nodes": frozenset({"spec.unschedulable"}),
}

_SET_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda _obj: True
    tests: list[Predicate] = []
    for term in _split_top(text):
        tests.append(_label_term(term))

    def match(obj: JSON) -> bool:
        return all(t(obj) for t in tests)
    return match


def _labels(obj: JSON) -> dict[str, str]:
    labels: dict[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


def _label_term(term: str) -> Predicate:
    m = _SET_RE.match(term)
    if m:
        key, op, raw = m.group(1), m.group(2), m.group(3)
        values = {v.strip() for v in raw.split(",") if v.strip()}
        if op == "in":
            return lambda o: _labels(o).get(key) in values
        return lambda o: _labels(o).get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (s.strip() for s in term.split(op, 1))
            if not key:
                break
            if op == "!=":
                return lambda o: _labels(o).get(key) != value
            return lambda o: _labels(o).get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda o: key not in _labels(o)
    if re.fullmatch(r"[A-Za-z0-9_./-]+", term):
        return lambda o: term in _labels(o)
    raise bad_request(f"unable to parse requirement: invalid label selector term {term!r}")


def field_value(obj: JSON, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_selector(text: str | None, plural: str) -> Predicate:
    if not text:
        return lambda _obj: True
    allowed = {"metadata.name", "metadata.namespace"} | FIELD_LABELS.get(plural, frozenset())
    tests: list[Predicate] = []
    for term in _split_top(text):
        op = "!=" if "!=" in term else "==" if "==" in term else "="
        if op not in term:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key, value = (s.strip() for s in term.split(op, 1))
        if key not in allowed:
            raise bad_request(f'field label not supported: {key}')
        tests.append(_field_test(key, value, negate=op == "!="))

    def match(obj: JSON) -> bool:
        return all(t(obj) for t in tests)
    return match


def _field_test(key: str, value: str, *, negate: bool) -> Predicate:
    def test(obj: JSON) -> bool:
        return (field_value(obj, key) == value) != negate
    return test
