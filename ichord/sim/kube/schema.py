"""Structural OpenAPI v3 schemas of CRDs: pruning, defaulting and validation like the API server.

Messages follow k8s.io/apimachinery's field errors (``spec.role: Unsupported value: "x": supported
values: "controlplane", "worker"``). Of ``x-kubernetes-validations`` only the CEL shapes the chart uses are
evaluated (``self == oldSelf``, ``!has(self.a) || self.b == 'v'``, ``has(self.a) != has(self.b)`` and a
maintenance window's bounds: a duration, a start to end); other rules are accepted and ignored (a documented limitation
of the simulator, which tests/unit/test_kube_crds.py keeps from mattering: every rule of the CRDs must be one of them).
A list-type map refuses two items of one key, as the real server does.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from ichord.jsoncopy import copy_json

JSON = dict[str, Any]
#: (reason, field path, message) like field.Error.
Cause = tuple[str, str, str]


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _matches_type(value: Any, want: str) -> bool:
    got = _type_name(value)
    return got == want or (want == "number" and got == "integer")


def _quote(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(
        value, bool) else str(value) if isinstance(value, (int, float)) else json.dumps(value)


#: ObjectMeta's fields: any other key of a custom resource's metadata is unknown (pruned, warned, refused).
OBJECT_META = frozenset({"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
                         "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
                         "annotations", "ownerReferences", "finalizers", "managedFields"})


def prune_and_default(value: Any, schema: JSON, *, top: bool = True) -> Any:
    """Drop fields the schema does not know and fill in defaults (in place where possible)."""
    if top and isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        for key in [k for k in value["metadata"] if k not in OBJECT_META]:
            del value["metadata"][key]
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props: JSON = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        if props and not schema.get("x-kubernetes-preserve-unknown-fields"):
            for key in [k for k in value if k not in props]:
                if top and key in ("apiVersion", "kind", "metadata"):
                    continue
                del value[key]
        for key, sub in props.items():
            if key == "metadata" and top:
                continue
            if key not in value and "default" in sub:
                value[key] = copy_json(sub["default"])
            if key in value:
                value[key] = prune_and_default(value[key], sub, top=False)
        if isinstance(extra, dict):
            for key in list(value):
                if key not in props:
                    value[key] = prune_and_default(value[key], extra, top=False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_and_default(v, schema["items"], top=False) for v in value]
    return value


def unknown_fields(value: Any, schema: JSON, path: str = "") -> list[str]:
    """The fields pruning would drop (``fieldValidation=Strict`` refuses them instead)."""
    out: list[str] = []
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props: JSON = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, sub_value in value.items():
            if not path and key == "metadata" and isinstance(sub_value, dict):
                out += [f"metadata.{k}" for k in sub_value if k not in OBJECT_META]
                continue
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue
            if key in props:
                out += unknown_fields(sub_value, props[key], _join(path, key))
            elif isinstance(extra, dict):
                out += unknown_fields(sub_value, extra, _join(path, key))
            elif props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(_join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


#: kube-apiserver's cause when schema errors kept the CEL rules from running.
RULES_NOT_CHECKED: Cause = ("FieldValueInvalid", "<nil>", "Invalid value: null: some validation rules were not "
                            "checked because the object was invalid; correct the existing errors to complete "
                            "validation")


def validate(value: Any, schema: JSON, path: str = "", old: Any = None) -> list[Cause]:
    """Every violation of ``schema`` by ``value``; ``old`` is the stored value for transition rules.

    As kube-apiserver: the CEL rules (x-kubernetes-validations) are evaluated only on an object that passed
    the structural checks; otherwise one ``<nil>`` cause says they were not checked."""
    causes: list[Cause] = []
    rule_causes: list[Cause] = []
    _check(value, schema, path, old, causes, rule_causes)
    if any(c[0] in _BLOCKING for c in causes):
        return [*causes, RULES_NOT_CHECKED] if _has_rules(schema) else causes
    return [*causes, *rule_causes]


#: The errors that keep kube-apiserver from evaluating the CEL rules (apiextensions' hasBlockingErr: a wrong type,
#: an enum, a required field, too long, too many); after any other (a pattern, a bound, a duplicate) they run.
_BLOCKING = frozenset({"FieldValueTypeInvalid", "FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong",
                       "TooMany"})


def _has_rules(schema: Any) -> bool:
    if isinstance(schema, dict):
        return bool(schema.get("x-kubernetes-validations")) or any(_has_rules(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_rules(v) for v in schema)
    return False


def _check(value: Any, schema: JSON, path: str, old: Any, causes: list[Cause], rule_causes: list[Cause]) -> None:
    want = schema.get("type")
    if value is None and schema.get("nullable"):
        return
    if want and not _matches_type(value, want):
        causes.append(("FieldValueTypeInvalid", path, f"Invalid value: \"{_type_name(value)}\": "
                       f"{path} in body must be of type {want}: \"{_type_name(value)}\""))
        return
    if schema.get("x-kubernetes-int-or-string") and _type_name(value) not in ("integer", "string"):
        causes.append(("FieldValueTypeInvalid", path, f"Invalid value: \"{_type_name(value)}\": "
                       f"{path} in body must be of type integer,string: \"{_type_name(value)}\""))
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_quote(v) for v in schema["enum"])
        causes.append(("FieldValueNotSupported", path,
                       f"Unsupported value: {_quote(value)}: supported values: {supported}"))
    _check_bounds(value, schema, path, causes)
    for rule in schema.get("x-kubernetes-validations") or []:
        if _rule_fails(rule.get("rule", ""), value, old):
            msg = rule.get("message") or f"failed rule: {rule.get('rule', '')}"
            # kube-apiserver 1.36 (the real tier) shows a scalar's value and omits an object's or a list's.
            shown = "" if isinstance(value, (dict, list)) else f"{_quote(value)}: "
            rule_causes.append(("FieldValueInvalid", path, f"Invalid value: {shown}{msg}"))
    if isinstance(value, dict) and schema.get("oneOf"):
        # Only the shape the chart uses: branches of ``required`` lists (exactly one must hold, as the API server's
        # value validation asks of oneOf).
        held = sum(1 for branch in schema["oneOf"] if all(k in value for k in branch.get("required") or []))
        if held != 1:
            causes.append(("FieldValueInvalid", path, f"Invalid value: \"object\": {path} in body must validate one "
                           "and only one schema (oneOf)"))
    if isinstance(value, dict):
        props: JSON = schema.get("properties") or {}
        for req in schema.get("required") or []:
            if req not in value:
                causes.append(("FieldValueRequired", _join(path, req), "Required value"))
        extra = schema.get("additionalProperties")
        for key, sub_value in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is None or (key == "metadata" and not path):
                continue
            old_sub = old.get(key) if isinstance(old, dict) else None
            _check(sub_value, sub, _join(path, key), old_sub, causes, rule_causes)
    elif isinstance(value, list):
        items = schema.get("items")
        if schema.get("x-kubernetes-list-type") == "map":
            causes += _duplicate_keys(value, schema.get("x-kubernetes-list-map-keys") or [], path)
        if schema.get("x-kubernetes-list-type") == "set":
            seen: list[Any] = []
            for i, item in enumerate(value):
                if item in seen:
                    causes.append(("FieldValueDuplicate", f"{path}[{i}]", f"Duplicate value: {_quote(item)}"))
                seen.append(item)
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _check(item, items, f"{path}[{i}]", None, causes, rule_causes)


def _duplicate_keys(items: list[Any], keys: list[str], path: str) -> list[Cause]:
    """A list-type map's items whose keys an earlier item has: the first repetition of each, as kube-apiserver
    names them (``Duplicate value: {"name":"w"}``)."""
    seen: set[str] = set()
    reported: set[str] = set()
    out: list[Cause] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        key = json.dumps({k: item[k] for k in keys if k in item}, separators=(",", ":"))
        if key in seen and key not in reported:
            reported.add(key)
            out.append(("FieldValueDuplicate", f"{path}[{i}]", f"Duplicate value: {key}"))
        seen.add(key)
    return out


_IMPLIES = re.compile(r"^!has\(self\.(\w+)\)\|\|self\.(\w+)==['\"]([^'\"]*)['\"]$")
#: ``has(self.a) != has(self.b)``: exactly one of two fields (a health gate's caBundle reference).
_ONE_OF_TWO = re.compile(r"^has\(self\.(\w+)\)!=has\(self\.(\w+)\)$")


#: A duration string of whole numbers with units d, h, m, s summed and bounded in seconds (a maintenance window's).
_DURATION_AT_MOST = re.compile(re.escape(
    "self.findAll('[0-9]+[dhms]').map(p,int(p.substring(0,p.size()-1))*(p.endsWith('d')?86400:p.endsWith('h')?3600:"
    "p.endsWith('m')?60:1)).sum()<=").replace("<=", "<=") + r"(\d+)$")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
#: ``!has(self.start) || !has(self.end) || timestamp(self.end) - timestamp(self.start) <= duration('Nh')``: a one-off
#: maintenance window's length bound.
_SPAN_AT_MOST = re.compile(r"^!has\(self\.(\w+)\)\|\|!has\(self\.(\w+)\)\|\|timestamp\(self\.\2\)-timestamp\(self\.\1\)"
                           r"<=duration\('(\d+)h'\)$")
_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def evaluates(rule: str) -> bool:
    """True when ``rule`` is one of the CEL shapes this simulator enforces (the others are ignored)."""
    compact = _compact(rule)
    return compact == "self==oldSelf" or any(p.match(compact) is not None
                                             for p in (_IMPLIES, _ONE_OF_TWO, _DURATION_AT_MOST, _SPAN_AT_MOST))


def _compact(rule: str) -> str:
    return re.sub(r"\s+", "", rule)


def _rule_fails(rule: str, value: Any, old: Any) -> bool:
    """The CEL shapes ichord's CRDs use; any other rule is not evaluated."""
    compact = _compact(rule)
    if compact == "self==oldSelf":
        return old is not None and value != old
    m = _IMPLIES.match(compact)
    if m and isinstance(value, dict):
        return m.group(1) in value and value.get(m.group(2)) != m.group(3)
    m = _ONE_OF_TWO.match(compact)
    if m and isinstance(value, dict):
        return (m.group(1) in value) == (m.group(2) in value)
    m = _DURATION_AT_MOST.match(compact)
    if m and isinstance(value, str):
        total = sum(int(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"([0-9]+)([dhms])", value))
        return total > int(m.group(1))
    m = _SPAN_AT_MOST.match(compact)
    if m and isinstance(value, dict) and m.group(1) in value and m.group(2) in value:
        start, end = _timestamp(value[m.group(1)]), _timestamp(value[m.group(2)])
        # CEL's timestamp() of a string it cannot read is an error, and an error refuses the object.
        return start is None or end is None or (end - start).total_seconds() > int(m.group(3)) * 3600
    return False


def _timestamp(value: Any) -> dt.datetime | None:
    """CEL's ``timestamp(string)``: an RFC 3339 time with its offset, else None (the rule errs)."""
    if not isinstance(value, str) or _RFC3339.match(value) is None:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _check_bounds(value: Any, schema: JSON, path: str, causes: list[Cause]) -> None:
    def bad(msg: str) -> None:
        causes.append(("FieldValueInvalid", path, f"Invalid value: {_quote(value)}: {path} in body {msg}"))

    if isinstance(value, str):
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            bad(f"should match '{schema['pattern']}'")
        if "minLength" in schema and len(value) < schema["minLength"]:
            bad(f"should be at least {schema['minLength']} chars long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            bad(f"may not be longer than {schema['maxLength']}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            bad(f"should be greater than or equal to {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            bad(f"should be less than or equal to {schema['maximum']}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(("FieldValueInvalid", path, f"Invalid value: {len(value)}: {path} in body should "
                           f"have at least {schema['minItems']} items"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(("TooMany", path, f"Too many: {len(value)}: must have at most "
                           f"{schema['maxItems']} items"))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
