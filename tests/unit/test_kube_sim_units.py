"""Pure pieces of the simulator: patches, selectors, schema messages, printer-column JSONPath."""

from __future__ import annotations

import pytest

from ichord.sim.kube import patch, schema, selectors, tables
from ichord.sim.kube.status import ApiError


def test_merge_patch_deletes_with_null_and_replaces_lists() -> None:
    out = patch.merge_patch({"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None}, "l": [3]})
    assert out == {"a": {"c": 2}, "l": [3]}


def test_merge_patch_changes_neither_input_and_shares_nothing_with_them() -> None:
    target = {"a": {"b": {"c": 1, "d": [1]}}, "s": "x", "n": {"k": 1}}
    body = {"a": {"b": {"c": None, "e": {"f": [2]}}}, "s": {"t": 1}, "n": None, "new": {"m": {"z": None}}}
    out = patch.merge_patch(target, body)
    assert out == {"a": {"b": {"d": [1], "e": {"f": [2]}}}, "s": {"t": 1}, "new": {"m": {}}}
    assert target == {"a": {"b": {"c": 1, "d": [1]}}, "s": "x", "n": {"k": 1}}
    assert body["a"]["b"]["c"] is None and "z" in body["new"]["m"]
    out["a"]["b"]["d"].append(9)
    out["a"]["b"]["e"]["f"].append(9)
    assert target["a"]["b"]["d"] == [1] and body["a"]["b"]["e"]["f"] == [2]


def test_strategic_merge_by_key_and_delete_directive() -> None:
    target = {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}],
              "args": ["a", "b"]}
    out = patch.strategic_merge_patch(target, {"conditions": [{"type": "Ready", "status": "True"},
                                                              {"type": "X", "$patch": "delete"}],
                                               "args": ["c"]})
    assert out == {"conditions": [{"type": "Ready", "status": "True"}], "args": ["c"]}
    with pytest.raises(patch.PatchError):
        patch.strategic_merge_patch(target, {"conditions": [{"status": "True"}]})


def test_json_patch_operations() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = patch.json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3}, {"op": "remove", "path": "/b/c"},
                                 {"op": "replace", "path": "/a/0", "value": 0},
                                 {"op": "copy", "from": "/a", "path": "/d"},
                                 {"op": "test", "path": "/d/2", "value": 3}])
    assert out == {"a": [0, 2, 3], "b": {}, "d": [0, 2, 3]}
    assert doc == {"a": [1, 2], "b": {"c": 1}}  # the input is not modified
    with pytest.raises(patch.PatchError):
        patch.json_patch(doc, [{"op": "remove", "path": "/missing"}])


def test_label_and_field_selectors() -> None:
    obj = {"metadata": {"name": "n", "labels": {"app": "x", "tier": "a"}}, "spec": {"nodeName": "w1"}}
    assert selectors.label_selector("app=x,tier in (a,b)")(obj)
    assert not selectors.label_selector("app!=x")(obj)
    assert selectors.label_selector("!missing,app")(obj)
    assert selectors.field_selector("spec.nodeName=w1,metadata.name!=m", "pods")(obj)
    with pytest.raises(ApiError) as bad:
        selectors.field_selector("spec.nodeName=w1", "configmaps")
    assert bad.value.code == 400


def test_schema_messages_match_the_api_server() -> None:
    sch = {"type": "object", "required": ["spec"], "properties": {"spec": {"type": "object", "required": ["role"],
           "properties": {"role": {"type": "string", "enum": ["controlplane", "worker"]},
                          "port": {"type": "integer", "minimum": 1, "default": 6443}}}}}
    assert schema.validate({"spec": {"role": "x"}}, sch) == [
        ("FieldValueNotSupported", "spec.role", 'Unsupported value: "x": supported values: "controlplane", "worker"')]
    assert schema.validate({"spec": {}}, sch)[0][:2] == ("FieldValueRequired", "spec.role")
    assert "must be of type integer" in schema.validate({"spec": {"role": "worker", "port": "1"}}, sch)[0][2]
    obj = schema.prune_and_default({"spec": {"role": "worker", "junk": 1}}, sch)
    assert obj == {"spec": {"role": "worker", "port": 6443}}


def test_printer_column_jsonpath() -> None:
    obj = {"status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]}}
    assert tables.jsonpath(obj, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert tables.jsonpath(obj, ".spec.missing") is None
