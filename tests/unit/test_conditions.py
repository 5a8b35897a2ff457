from __future__ import annotations

import datetime as dt

from ichord.api.conditions import Condition, find, is_true, parse_time, set_condition
from ichord.pki.bundle import generate_bundle

T0 = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)


def test_transition_time_kept_while_status_unchanged() -> None:
    conds = set_condition([], Condition("Ready", "False", "Unreachable", "node down"), now=T0, observed_generation=3)
    conds = set_condition(conds, Condition("Ready", "False", "Unreachable", "still down"), now=T1)
    c = find(conds, "Ready")
    assert c is not None
    assert parse_time(c["lastTransitionTime"]) == T0
    assert c["message"] == "still down"
    conds = set_condition(conds, Condition("Ready", "True", "Converged"), now=T1)
    c = find(conds, "Ready")
    assert c is not None and parse_time(c["lastTransitionTime"]) == T1
    assert is_true(conds, "Ready") and not is_true(conds, "Other")


def test_conditions_sorted_and_scrubbed() -> None:
    b = generate_bundle()
    conds = set_condition([], Condition("B", "True", "X", f"key {(b.os.key_pem or b'').decode()}"), now=T0)
    conds = set_condition(conds, Condition("A", "False", "Y"), now=T0)
    assert [c["type"] for c in conds] == ["A", "B"]
    assert "BEGIN" not in conds[1]["message"]
