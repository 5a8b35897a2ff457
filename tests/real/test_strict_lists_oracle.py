"""Lists of mappings through ichord's strict decoder and Talos's, case by case: both must give the same verdict.

Every field of the v1alpha1 document and of the typed documents ichord writes whose value is a list of
structs (``cluster.inlineManifests``, ``machine.files``, ``machine.network.interfaces``,
``cluster.apiServer.admissionControl``, a LinkConfig's ``addresses``, ...), found in the contract's schema, is
given as a cluster patch four ways: a valid list of mappings, an element with an unknown key, an element with
a value of a type the element's field refuses, and a mapping where the list belongs. ichord renders it
(render/strict.py refuses with InvalidConfigError); Talos's oracle loads and applies the same patch with
configpatcher and loads the result (its semantic validator is not the decoder and is not counted). The two
must agree on accept/refuse in both directions, and where ichord refuses, its error names the field.

The generic differential (test_strict_oracle.py) never wrote a list of mappings into a type with its own
unmarshaler, so it missed ichord refusing ``cluster.inlineManifests`` written as Talos documents it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from ruamel.yaml.scalarstring import LiteralScalarString

from ichord import yamlio
from ichord.contract import VersionContract
from ichord.pki.bundle import generate_bundle
from ichord.render.config import MachineConfig
from ichord.render.errors import RenderError
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.strict import _FIELD_TEXT, InvalidConfigError, Schema, schema_for
from tests.real.test_render_oracle import _differences, _encoded, _generate_case, _oracle
from tests.real.test_strict_oracle import _DECODER, CONTRACTS, _invalid, _kinds, _valid

pytestmark = pytest.mark.real

_UNKNOWN = "zzUnknownKey"


def _list_fields(schema: Schema, t: dict[str, Any], path: tuple[str, ...],
                 out: list[tuple[tuple[str, ...], dict[str, Any]]]) -> None:
    """Every field reached through struct fields from ``t`` whose value is a list of structs (with fields)."""
    if t["kind"] != "struct" or not t.get("fields") or t.get("custom") or len(path) > 4:
        return
    for key, ref in sorted(t["fields"].items()):
        field = schema.types[ref]
        if field["kind"] == "slice" and "elem" in field:
            elem = schema.types[field["elem"]]
            if elem["kind"] == "struct" and elem.get("fields") and "emptymap" in elem["accepts"]:
                out.append(((*path, key), elem))
        _list_fields(schema, field, (*path, key), out)


def _element(schema: Schema, elem: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A valid element: one or two of its fields, each with a value of its type (base64 text where the element's
    own unmarshaler reads text whatever the Go field's type: crypto's PEM types)."""
    names = sorted(elem["fields"])
    chosen = rng.sample(names, min(len(names), rng.choice([1, 2])))
    if elem["go"] in _FIELD_TEXT:
        return dict.fromkeys(chosen, "eA==")
    return {k: _valid(schema.types[elem["fields"][k]], schema.types, rng, 1) for k in chosen}


def _cases(contract: VersionContract) -> list[tuple[str, str, dict[str, Any] | Any, tuple[str, ...], str | None]]:
    """(kind, what, value, path, refused field) per case; the refused field is None for a valid case."""
    schema = schema_for(contract)
    cases: list[tuple[str, str, Any, tuple[str, ...], str | None]] = []
    for kind in _kinds(contract):
        top = schema.document_type(kind)
        assert top is not None
        found: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        _list_fields(schema, top, (), found)
        for path, elem in found:
            rng = random.Random(f"{contract}-{kind}-{'.'.join(path)}")
            dotted = ".".join(path)
            cases.append((kind, "valid", [_element(schema, elem, rng), _element(schema, elem, rng)], path, None))
            unknown = {**_element(schema, elem, rng), _UNKNOWN: "x"}
            cases.append((kind, "unknown key", [unknown], path, f"{dotted}[0].{_UNKNOWN}"))
            for name in sorted(elem["fields"]):
                bad = _invalid(schema.types[elem["fields"][name]], rng)
                if bad is not None:
                    cases.append((kind, f"wrong type ({bad[0]})", [{name: bad[1]}], path, f"{dotted}[0].{name}"))
                    break
            cases.append((kind, "a mapping", _element(schema, elem, rng), path, dotted))
    return cases


def _patch(schema: Schema, kind: str, path: tuple[str, ...], value: Any) -> str:
    body: dict[str, Any] = {}
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    if kind != "v1alpha1":
        top = schema.document_type(kind)
        name = {"name": "lists"} if top is not None and "name" in (top.get("fields") or {}) else {}
        body = {"apiVersion": "v1alpha1", "kind": kind, **name, **body}
    return yamlio.dump(body)


@pytest.mark.parametrize("contract", CONTRACTS)
def test_lists_of_mappings_get_talos_verdict(contract: VersionContract) -> None:
    bundle = generate_bundle()
    bundle_yaml = bundle.to_yaml()
    cases = _cases(contract)
    oracle_cases: list[dict[str, Any]] = []
    ours: dict[int, RenderError | None] = {}
    texts: dict[int, str] = {}
    for i, (kind, _what, value, path, _field) in enumerate(cases):
        text = _patch(schema_for(contract), kind, path, value)
        cluster = ClusterInputs(cluster_name="lists", endpoint="https://lists.example:6443",
                                kubernetes_version="1.34.1", contract=contract, patches=(text,))
        machine = MachineInputs.from_spec({"role": "controlplane", "address": "10.5.0.2"})
        try:
            render(bundle, cluster, machine)
            ours[i] = None
        except RenderError as exc:
            ours[i] = exc
        texts[i] = text
        oracle_cases.append(_generate_case(str(i), bundle_yaml, cluster, machine))
    talos = _oracle(contract, oracle_cases)
    disagree, unnamed = [], []
    for i, (kind, what, _value, path, field) in enumerate(cases):
        error = talos[str(i)].get("error") or ""
        talos_refuses = error.startswith(_DECODER)
        refusal = ours[i]
        label = f"{kind} {'.'.join(path)}: {what}"
        if talos_refuses != (refusal is not None):
            disagree.append(f"{label}: Talos {'refuses: ' + error[:200] if talos_refuses else 'accepts'}; "
                            f"ichord {'refuses: ' + str(refusal)[:200] if refusal else 'accepts'}\n{texts[i]}")
        elif refusal is not None and field is not None:
            named = isinstance(refusal, InvalidConfigError) and (
                refusal.path == field or refusal.path.startswith((f"{field}[", f"{field}.")))
            if not named:
                unnamed.append(f"{label}: expected the field {field}, ichord says: {refusal}")
    fields = {(c[0], c[3]) for c in cases}
    print(f"\nlists of mappings {contract}: {len(fields)} fields, {len(cases)} cases, {len(disagree)} disagree")
    assert len(fields) >= 19, "the schema walk found fewer list-of-struct fields than the v1alpha1 document has"
    assert not disagree, "ichord's decoder and Talos's disagree:\n" + "\n".join(disagree)
    assert not unnamed, "ichord refused, naming another field:\n" + "\n".join(unnamed)


#: cluster.inlineManifests from a cluster patch and a machine patch (Talos appends one list to the other), two
#: manifests' contents starting with blank lines, a tab and a carriage return (Talos's unmarshaler trims those).
_INLINE = (
    "cluster:\n  inlineManifests:\n    - name: ns-a\n      contents: |\n        apiVersion: v1\n"
    "        kind: Namespace\n        metadata:\n          name: a\n"
    "    - name: ns-b\n      contents: |\n\n\n        apiVersion: v1\n"
    "        kind: Namespace\n        metadata:\n          name: b\n    - name: ns-c\n"
    "      contents: \"\\t\\r\\napiVersion: v1\\nkind: Namespace\\nmetadata: {name: c}\\n\"\n",
    "cluster:\n  inlineManifests:\n    - name: cm\n      contents: |-\n        apiVersion: v1\n"
    "        kind: ConfigMap\n        metadata: {name: c, namespace: a}\n",
)


@pytest.mark.parametrize("contract", CONTRACTS)
@pytest.mark.parametrize("role", ["controlplane", "worker"])
def test_inline_manifests_render_as_talos_generates_them(contract: VersionContract, role: str) -> None:
    """A cluster patch and a machine patch with cluster.inlineManifests: ichord's render equals Talos's, by value
    and by text."""
    bundle = generate_bundle()
    cluster = ClusterInputs(cluster_name="inline", endpoint="https://inline.example:6443", kubernetes_version="1.34.1",
                            contract=contract, patches=(_INLINE[0],))
    machine = MachineInputs.from_spec({"role": role, "address": "10.5.0.2", "patches": [_INLINE[1]]})
    ours = render(bundle, cluster, machine)
    theirs = _oracle(contract, [_generate_case("inline", bundle.to_yaml(), cluster, machine)])["inline"]
    assert theirs.get("config"), theirs.get("error")
    assert list(_differences(ours.plain(), MachineConfig.plain_of(theirs["config"]))) == []
    manifests = next(d for d in ours.plain() if "cluster" in d)["cluster"]["inlineManifests"]
    assert [m["name"] for m in manifests] == ["ns-a", "ns-b", "ns-c", "cm"]
    assert [m["contents"][:11] for m in manifests] == ["apiVersion:"] * 4
    # The text too; ns-c's contents ichord writes double-quoted, as its patch did, and Talos as a literal block.
    ours_v1alpha1 = next(d for d in ours.documents if "cluster" in d)
    ours_v1alpha1["cluster"]["inlineManifests"][2]["contents"] = LiteralScalarString(manifests[2]["contents"])
    assert ours.to_yaml() == _encoded(theirs["config"])
