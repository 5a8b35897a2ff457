from __future__ import annotations

import datetime as dt

from ichord.api.conditions import (
    MAX_MESSAGE,
    Condition,
    find,
    is_true,
    parse_time,
    set_condition,
    set_operation_phase,
)
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


def test_a_long_message_is_bounded_where_the_condition_and_the_phase_are_made() -> None:
    long = "gate failed: " + "Referent(annotation=None) " * 600  # 15 KB, what a CEL gate's error once carried
    cond = Condition("ConfigRollout", "False", "GateFailing", long)
    kept, _, tail = cond.message.partition("… (")
    assert len(cond.message) <= MAX_MESSAGE and long.startswith(kept)
    assert tail == f"{len(long) - len(kept)} more characters)"
    written = set_condition([], cond, now=T0)[0]["message"]
    assert written == cond.message  # what a later step compares with is what was written
    status: dict[str, object] = {}
    set_operation_phase(status, "Paused", long, now=T0)
    assert status["message"] == cond.message
    assert Condition("A", "True", "X", "short").message == "short"


def test_a_message_is_scrubbed_before_it_is_cut() -> None:
    key = (generate_bundle().os.key_pem or b"").decode()
    cond = Condition("B", "True", "X", "x" * (MAX_MESSAGE - 40) + key)
    assert "BEGIN" not in cond.message and "[REDACTED]" in cond.message and len(cond.message) <= MAX_MESSAGE
