"""maxUnavailable (issue 19): parsed as Kubernetes writes it, resolved operation > cluster > daemon, rounded down."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.api.max_unavailable import DEFAULT, MaxUnavailable, MaxUnavailableError, Source, resolve

# value as the API holds it -> (count, percent)
VALID: list[tuple[Any, tuple[int | None, int | None]]] = [
    (1, (1, None)),
    (4, (4, None)),
    (250, (250, None)),
    ("1%", (None, 1)),
    ("25%", (None, 25)),
    ("99%", (None, 99)),
    ("100%", (None, 100)),
]


@pytest.mark.parametrize(("value", "parsed"), VALID, ids=[repr(v) for v, _ in VALID])
def test_valid_values(value: Any, parsed: tuple[int | None, int | None]) -> None:
    got = MaxUnavailable.parse(value)
    assert (got.count, got.percent) == parsed
    assert got.to_api() == value and str(got) == str(value)


INVALID: list[Any] = [0, -1, True, False, 2.0, 1.5, None, "", "0", "4", "0%", "101%", "150%", "-5%", "05%", "2.5%",
                      "25 %", " 25%", "%", "25%%", "abc", [1], {"n": 1}]


@pytest.mark.parametrize("value", INVALID, ids=[repr(v) for v in INVALID])
def test_invalid_values_are_refused_with_what_to_write(value: Any) -> None:
    with pytest.raises(MaxUnavailableError, match=r"spec\.maxUnavailable must be a whole number of at least 1 or a "
                                                  r"percentage of the workers such as 25%") as refused:
        MaxUnavailable.parse(value, field="spec.maxUnavailable")
    assert repr(value) in str(refused.value)


# command-line text -> value (digits are a count there: argparse hands over strings)
TEXT: list[tuple[str, MaxUnavailable | None]] = [
    ("1", MaxUnavailable(count=1)),
    ("12", MaxUnavailable(count=12)),
    (" 25% ", MaxUnavailable(percent=25)),
    ("100%", MaxUnavailable(percent=100)),
    ("0", None),
    ("0%", None),
    ("101%", None),
    ("-1", None),
    ("", None),
    ("four", None),
]


@pytest.mark.parametrize(("text", "want"), TEXT, ids=[repr(t) for t, _ in TEXT])
def test_text_from_a_flag(text: str, want: MaxUnavailable | None) -> None:
    if want is None:
        with pytest.raises(MaxUnavailableError, match="--max-unavailable must be"):
            MaxUnavailable.parse_text(text)
    else:
        assert MaxUnavailable.parse_text(text) == want


# (value, workers) -> workers at once: a percentage rounded down (as Kubernetes' maxUnavailable), at least 1,
# never more than there are workers.
AT_ONCE: list[tuple[Any, int, int]] = [
    ("25%", 100, 25),
    ("25%", 103, 25),
    ("25%", 7, 1),
    ("25%", 4, 1),
    ("25%", 3, 1),
    ("25%", 1, 1),
    ("25%", 0, 1),
    ("50%", 12, 6),
    ("50%", 13, 6),
    ("10%", 100, 10),
    ("10%", 9, 1),
    ("1%", 100, 1),
    ("1%", 250, 2),
    ("100%", 5, 5),
    ("100%", 0, 1),
    (1, 100, 1),
    (4, 100, 4),
    (4, 3, 3),
    (4, 0, 4),
]


@pytest.mark.parametrize(("value", "workers", "at_once"), AT_ONCE, ids=[f"{v}-of-{w}" for v, w, _ in AT_ONCE])
def test_workers_at_once(value: Any, workers: int, at_once: int) -> None:
    assert MaxUnavailable.parse(value).workers_at_once(workers) == at_once


# (operation's, cluster's, daemon default) -> (value in force, source)
RESOLVE: list[tuple[Any, Any, MaxUnavailable, Any, Source]] = [
    (None, None, DEFAULT, "25%", Source.DAEMON),
    (None, None, MaxUnavailable(count=3), 3, Source.DAEMON),
    (None, "50%", DEFAULT, "50%", Source.CLUSTER),
    (None, 2, DEFAULT, 2, Source.CLUSTER),
    (5, "50%", DEFAULT, 5, Source.OPERATION),
    ("10%", 2, MaxUnavailable(count=3), "10%", Source.OPERATION),
    (1, None, DEFAULT, 1, Source.OPERATION),
    # Only the value in force is read: a bad cluster value under an operation's own is not the operation's concern.
    (2, "bad", DEFAULT, 2, Source.OPERATION),
]


@pytest.mark.parametrize(("op", "cluster", "default", "value", "source"), RESOLVE)
def test_resolution_order(op: Any, cluster: Any, default: MaxUnavailable, value: Any, source: Source) -> None:
    bound = resolve(op, cluster, default, 100)
    assert (bound.value.to_api(), bound.source, bound.workers) == (value, source, 100)
    assert bound.at_once == bound.value.workers_at_once(100)


@pytest.mark.parametrize(("op", "cluster", "where"), [
    ("0%", None, "the TalosOperation's spec.maxUnavailable"),
    (0, "50%", "the TalosOperation's spec.maxUnavailable"),
    (None, "4", "the TalosCluster's spec.maxUnavailable"),
    (None, -2, "the TalosCluster's spec.maxUnavailable"),
])
def test_a_bad_value_in_force_names_where_it_is_written(op: Any, cluster: Any, where: str) -> None:
    with pytest.raises(MaxUnavailableError, match=f"^{where} must be"):
        resolve(op, cluster, DEFAULT, 10)


def test_the_plan_states_the_bound_as_resolved() -> None:
    bound = resolve(None, None, DEFAULT, 100)
    assert bound.describe() == "workers 25 at a time (maxUnavailable 25% of 100 workers, the daemon's " \
                               "--max-unavailable)"
    assert bound.to_status() == {"atOnce": 25, "maxUnavailable": "25%", "source": "daemon", "workers": 100,
                                 "message": bound.describe()}
    assert resolve(3, None, DEFAULT, 100).describe() == "workers 3 at a time (maxUnavailable 3, the operation's)"
    assert resolve(None, "50%", DEFAULT, 12).describe() == ("workers 6 at a time (maxUnavailable 50% of 12 workers, "
                                                            "the TalosCluster's)")


@pytest.mark.parametrize("fields", [{}, {"count": 1, "percent": 5}, {"count": 0}, {"percent": 0}, {"percent": 101}])
def test_a_value_is_a_count_or_a_percentage(fields: dict[str, int]) -> None:
    with pytest.raises(MaxUnavailableError):
        MaxUnavailable(**fields)
