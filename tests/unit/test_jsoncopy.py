"""copy_json: a copy (the simulator store's hand-outs, the daemon's working copies) shares nothing mutable with
its original."""

from __future__ import annotations

import copy
import random
from typing import Any

from ichord.jsoncopy import copy_json


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["str", "int", "float", "bool", "none"] + (["dict", "list"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "dict":
        return {f"k{i}": _random_json(rng, depth + 1) for i in range(rng.randint(0, 4))}
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {"str": "s", "int": rng.randint(-5, 5), "float": rng.random(), "bool": rng.random() < 0.5,
            "none": None}[kind]


def _mutables(value: Any) -> list[int]:
    out: list[int] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            out.append(id(v))
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            out.append(id(v))
            stack.extend(v)
    return out


def test_a_copy_equals_the_original_and_shares_no_container_with_it() -> None:
    rng = random.Random(19)
    for _ in range(300):
        original = {"metadata": {"name": "x"}, "spec": _random_json(rng)}
        before = copy.deepcopy(original)
        got = copy_json(original)
        assert got == original
        assert not set(_mutables(got)) & set(_mutables(original))
        got["spec"] = "changed"
        got["metadata"]["name"] = "y"
        assert original == before


def test_a_value_that_is_not_plain_json_is_still_copied() -> None:
    inner = {"a": [1]}
    original = {"t": (inner,)}
    got = copy_json(original)
    assert got == original
    got["t"][0]["a"].append(2)
    assert inner == {"a": [1]}
