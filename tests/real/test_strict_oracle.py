"""The validator differential: ichord's strict decoder check (render/strict.py) against Talos's own decoder.

Per contract, seeded random patch sets (valid and invalid: wrong types, unknown fields, unknown kinds) over the
v1alpha1 document and every typed document kind ichord writes, each as a cluster patch on a control plane or a
worker. ichord renders (refused: any RenderError); Talos's oracle loads and applies the same patches with
configpatcher (refused: an error loading or applying them, or loading the result; its semantic validator's
verdict is not the decoder's and is not counted). Zero cases may be refused by Talos and accepted by ichord;
the opposite direction is counted and printed. The seed is printed; ICHORD_STRICT_SEED replays a run,
ICHORD_STRICT_CASES sizes it (per contract, default 2000).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from ichord import yamlio
from ichord.contract import VersionContract
from ichord.pki.bundle import generate_bundle
from ichord.render import keyorder
from ichord.render.errors import RenderError
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.strict import PROBES, STRING_PROBES, schema_for
from tests.real import tools
from tests.real.test_render_oracle import ORACLES, _generate_case, _oracle

pytestmark = pytest.mark.real

SEED = int(os.environ.get("ICHORD_STRICT_SEED") or random.SystemRandom().randrange(1 << 32))
CASES = int(os.environ.get("ICHORD_STRICT_CASES", "2000"))
CONTRACTS = [pytest.param(c, id=str(c), marks=pytest.mark.skipif(tools.missing(o) is not None,
                                                                 reason=tools.missing(o) or ""))
             for c, o in ORACLES.items()]
#: Talos's refusals of the patches themselves (configpatcher, the decoder), as the oracle words them.
_DECODER = ("loading the patches", "applying the patches", "the patched configuration", "the patched v1alpha1")


def _kinds(contract: VersionContract) -> list[str]:
    """The v1alpha1 document and every typed kind ichord writes that the contract's decoder knows."""
    known = schema_for(contract).documents
    return ["v1alpha1", *sorted(k for k in keyorder._TYPED if k in known)]  # the kinds ichord writes


def _valid(t: dict[str, Any], types: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if t.get("enum"):
        return rng.choice(t["enum"])
    if t["kind"] == "struct" and t.get("fields") and not t.get("custom") and depth < 3:
        key = rng.choice(sorted(t["fields"]))
        return {key: _valid(types[t["fields"][key]], types, rng, depth + 1)}
    if t["kind"] == "map" and not t.get("custom") and depth < 3:
        return {f"k{rng.randrange(9)}": _valid(types[t["elem"]], types, rng, depth + 1)}
    if t["kind"] == "slice" and not t.get("custom") and depth < 3:
        return [_valid(types[t["elem"]], types, rng, depth + 1)]
    accepted = sorted(p for p in t["accepts"] if p != "null" and p not in ("map", "seq", "seqmap", "seqseq"))
    return PROBES[rng.choice(accepted)] if accepted else None


def _invalid(t: dict[str, Any], rng: random.Random) -> tuple[str, Any] | None:
    """A value of a class Talos's decoder refuses for ``t`` (a container, or a scalar class), or None."""
    refused = [p for p in PROBES if p not in t["accepts"] and p not in ("map", "seq")]
    if t.get("custom") and set(t["accepts"]) & STRING_PROBES and not t.get("enum"):
        refused = [p for p in refused if p not in STRING_PROBES]  # its content is its own unmarshaler's
    if t.get("bits"):
        refused = [p for p in refused if p not in ("floatint",)]
    if not refused:
        return None
    probe = rng.choice(refused)
    return probe, PROBES[probe]


#: Values given to any field whatever its type: Talos's verdict on each is the truth (numbers at integer edges,
#: strings that read as other types, enumeration names, containers).
POOL: tuple[Any, ...] = (
    0, 1, 255, 256, 65535, 65536, -5, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 0.5, 2.0, -1.5, True, False, None,
    "abc", "10", "-3", "yes", "off", "on", "true", "1.5", "5m", "1h30m", "0", "10.0.0.0/8", "fd00::/8", "::1",
    "1.2.3.4", "https://example.com", "stable", "802.3ad", "balance-rr", "10GB", "0644", "", "a b",
    [], ["x"], [1, 2], [{"a": 1}], {}, {"a": "b"}, {"a": {"b": 1}}, {"name": "x"},
)


def _patch(contract: VersionContract, rng: random.Random) -> tuple[str, str]:
    """(patch text, what it is) for one case."""
    schema = schema_for(contract)
    kind = rng.choice(_kinds(contract))
    top = schema.document_type(kind)
    assert top is not None
    body: dict[str, Any] = {}
    path: list[str] = []
    t = top
    what = "valid"
    for _ in range(rng.randrange(1, 4)):
        if t["kind"] != "struct" or not t.get("fields") or t.get("custom"):
            break
        names = sorted(k for k in t["fields"] if not (t is top and k in ("apiVersion", "kind", "name")))
        if not names:
            break
        key = rng.choice(names)
        path.append(key)
        t = schema.types[t["fields"][key]]
    roll = rng.random()
    if roll < 0.3:
        value: Any = _valid(t, schema.types, rng, 0)
    elif roll < 0.5:
        what = "any value"
        value = rng.choice(POOL)
    elif roll < 0.75:
        bad = _invalid(t, rng)
        if bad is None:
            value = _valid(t, schema.types, rng, 0)
        else:
            what = f"wrong type ({bad[0]})"
            value = bad[1]
    else:
        what = "unknown field"
        path.append(f"zz{rng.randrange(1000)}")
        value = rng.choice(["x", 1, True, {"a": "b"}])
    if rng.random() < 0.03:
        kind, what = "NoSuchConfig", "unknown kind"
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if path:
        node[path[-1]] = value
    if kind != "v1alpha1":
        name = {"name": f"n{rng.randrange(5)}"} if "name" in (top["fields"] or {}) else {}
        body = {"apiVersion": "v1alpha1", "kind": kind, **name, **body}
    elif not body:
        body = {"machine": {}}
    if kind == "v1alpha1" and path and rng.random() < 0.1:
        # A JSON6902 patch: Talos applies it to the encoded document and decodes the result.
        op = {"op": "add", "path": "/" + "/".join(path), "value": value}
        if len(path) > 1:
            op = {"op": "add", "path": "/" + path[0], "value": body[path[0]]}
        return yamlio.dump([op]), f"JSON6902 {kind} {'.'.join(path)}: {what}"
    return yamlio.dump(body), f"{kind} {'.'.join(path)}: {what}"


@pytest.mark.parametrize("contract", CONTRACTS)
def test_ichord_refuses_everything_talos_decoder_refuses(contract: VersionContract) -> None:
    print(f"\nstrict differential {contract}: seed {SEED} (ICHORD_STRICT_SEED={SEED} replays), {CASES} cases")
    rng = random.Random(f"{SEED}-{contract}")
    bundle = generate_bundle()
    bundle_yaml = bundle.to_yaml()
    cases, ichord, described = [], {}, {}
    for i in range(CASES):
        text, what = _patch(contract, rng)
        role = rng.choice(["controlplane", "worker"])
        cluster = ClusterInputs(cluster_name="strict", endpoint="https://strict.example:6443",
                                kubernetes_version="1.34.1", contract=contract, patches=(text,))
        machine = MachineInputs.from_spec({"role": role, "address": "10.5.0.2"})
        case_id = f"{i}"
        try:
            render(bundle, cluster, machine)
            ichord[case_id] = None
        except RenderError as exc:
            ichord[case_id] = str(exc)
        described[case_id] = (what, text)
        cases.append(_generate_case(case_id, bundle_yaml, cluster, machine))
    talos = _oracle(contract, cases)
    missed, stricter, both, neither = [], [], 0, 0
    for case_id, refusal in ichord.items():
        error = talos[case_id].get("error") or ""
        talos_refuses = error.startswith(_DECODER)
        if talos_refuses and refusal is None:
            missed.append(f"{described[case_id]}: Talos: {error[:300]}")
        elif refusal is not None and not talos_refuses:
            stricter.append(f"{described[case_id][0]}: ichord: {refusal[:200]}")
        elif refusal is not None:
            both += 1
        else:
            neither += 1
    kinds = {described[c][0].split()[0] for c in ichord}
    print(f"  document kinds: {len(kinds)} ({', '.join(sorted(kinds))})")
    print(f"  both refuse {both}, both accept {neither}, Talos refuses and ichord accepts {len(missed)}, "
          f"ichord refuses and Talos accepts {len(stricter)}")
    for line in stricter[:15]:
        print(f"    stricter: {line}")
    assert not missed, f"seed {SEED}: ichord accepted what Talos's decoder refuses:\n" + "\n".join(missed[:20])
