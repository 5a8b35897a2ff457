"""kube/status.py's merge_diff: applied as a JSON merge patch (the simulator's, held to kube-apiserver's by
tests/real/test_sim_differential.py) to the status it was computed from, it gives the new status exactly."""

from __future__ import annotations

import random
from typing import Any

from ichord.kube.status import merge_diff
from ichord.sim.kube.patch import merge_patch


def _doc(rng: random.Random, depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rng.sample("abcdefg", rng.randint(0, 5)):
        roll = rng.random()
        if depth < 3 and roll < 0.35:
            out[key] = _doc(rng, depth + 1)
        elif roll < 0.5:
            out[key] = [rng.randint(0, 3) for _ in range(rng.randint(0, 3))]
        elif roll < 0.55:
            out[key] = None
        else:
            out[key] = rng.choice([0, 1, "x", "y", True, False])
    return out


def _mutated(rng: random.Random, doc: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    out = dict(doc)
    for key in list(out):
        roll = rng.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.35 and isinstance(out[key], dict):
            out[key] = _mutated(rng, out[key], depth + 1)
        elif roll < 0.45:
            out[key] = rng.choice([{}, [], None, 2, "z", _doc(rng, depth + 1)])
    out.update(_doc(rng, depth + 1) if rng.random() < 0.3 else {})
    return out


def _without_nulls(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_nulls(v) for k, v in doc.items() if v is not None}
    return doc


def test_the_difference_applied_to_the_old_status_gives_the_new_one() -> None:
    rng = random.Random(32)
    for _ in range(2000):
        old = _without_nulls(_doc(rng, 0))  # a stored status holds no null
        new = _mutated(rng, old)
        assert merge_patch(old, merge_diff(old, new)) == _without_nulls(new), (old, new)


def test_only_what_changed_is_in_it() -> None:
    old = {"plan": {"machines": [{"name": "a"}, {"name": "b"}]}, "rolls": {"a": {"done": []}}, "stage": "S"}
    assert merge_diff(old, old) == {}
    assert merge_diff(old, {**old, "rolls": {"a": {"done": ["a"]}, "b": {"done": []}}}) == {
        "rolls": {"a": {"done": ["a"]}, "b": {"done": []}}}
    assert merge_diff(old, {"plan": old["plan"]}) == {"rolls": None, "stage": None}
    assert merge_diff(old, {**old, "rolls": {}}) == {"rolls": {"a": None}}
