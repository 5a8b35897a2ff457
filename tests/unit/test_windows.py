"""Maintenance windows' maths (ichord/operations/windows.py): cron fields, zones, daylight saving, one-off windows,
and what an operation is told."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from ichord.operations.windows import (
    Recurring,
    Windows,
    WindowSpecError,
    parse_cron,
    verdict,
)

UTC = dt.UTC


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def recurring(schedule: str, duration: str = "1h", zone: str = "UTC", name: str = "w") -> Windows:
    windows = Windows.from_cluster_spec({"maintenance": {"windows": [
        {"name": name, "schedule": schedule, "duration": duration, "timeZone": zone}]}})
    assert windows is not None
    return windows


def starts(schedule: str, zone: str, since: str, n: int) -> list[str]:
    window = recurring(schedule, zone=zone).recurring[0]
    out = []
    for s in window.starts(at(since)):
        out.append(s.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if len(out) == n:
            break
    return out


# ---- cron fields ------------------------------------------------------------------------------------


def test_fields_ranges_steps_lists_and_names() -> None:
    cron = parse_cron("*/15 1-3,22 1 jan-MAR/2 MON-fri")
    assert cron.minutes == {0, 15, 30, 45}
    assert cron.hours == {1, 2, 3, 22}
    assert cron.months == {1, 3}
    assert cron.weekdays == {1, 2, 3, 4, 5}
    assert parse_cron("0 0 * * 7").weekdays == {0}  # 7 is Sunday, as 0
    assert parse_cron("5/20 * * * *").minutes == {5, 25, 45}


@pytest.mark.parametrize(("schedule", "says"), [
    ("0 22 * *", "has 4 fields"),
    ("60 22 * * *", "minute: 60 is out of range 0-59"),
    ("0 24 * * *", "hour: 24 is out of range 0-23"),
    ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
    ("0 0 * 13 *", "month: 13 is out of range 1-12"),
    ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
    ("0 0 * * FUN", "day-of-week: 'FUN' is not a number"),
    ("*/0 0 * * *", "the step '0'"),
    ("0 5-1 * * *", "runs backwards"),
    ("0 0 1,,2 * *", "an empty item"),
])
def test_a_bad_schedule_names_its_field(schedule: str, says: str) -> None:
    with pytest.raises(WindowSpecError, match=says):
        parse_cron(schedule)


def test_both_day_fields_restricted_match_either_as_cron_does() -> None:
    # The 13th of the month or any Friday (Vixie cron), from Monday 2026-11-09.
    got = starts("0 0 13 * FRI", "UTC", "2026-11-09T00:00:00Z", 3)
    assert got == ["2026-11-13T00:00:00Z", "2026-11-20T00:00:00Z", "2026-11-27T00:00:00Z"]
    got = starts("0 0 10 * FRI", "UTC", "2026-11-09T00:00:00Z", 2)
    assert got == ["2026-11-10T00:00:00Z", "2026-11-13T00:00:00Z"]


def test_a_leap_day_recurs_four_years_later_and_an_impossible_day_is_refused() -> None:
    assert starts("0 0 29 2 *", "UTC", "2025-01-01T00:00:00Z", 2) == ["2028-02-29T00:00:00Z",
                                                                      "2032-02-29T00:00:00Z"]
    with pytest.raises(WindowSpecError, match="never matches a day"):
        recurring("0 0 31 2 *")


# ---- zones and daylight saving ------------------------------------------------------------------------


def test_a_weekly_window_in_berlin_follows_its_offset_through_the_year() -> None:
    # Saturdays 22:00 Berlin: 20:00Z in summer (CEST), 21:00Z in winter (CET).
    assert starts("0 22 * * SAT", "Europe/Berlin", "2026-10-20T00:00:00Z", 2) == [
        "2026-10-24T20:00:00Z", "2026-10-31T21:00:00Z"]


def test_a_start_in_the_skipped_hour_opens_when_the_hour_ends() -> None:
    # New York skips 02:00-03:00 on 2026-03-08: the 02:30 start opens at 03:00 EDT (07:00Z), once.
    assert starts("30 2 * * *", "America/New_York", "2026-03-07T00:00:00Z", 3) == [
        "2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    # Berlin skips 02:00-03:00 on 2026-03-29: 02:00 and 02:30 both open at 03:00 CEST (01:00Z), as one start.
    assert starts("0,30 2 * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", 2) == [
        "2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"]


def test_a_start_in_the_repeated_hour_opens_once_at_its_first_occurrence() -> None:
    # New York repeats 01:00-02:00 on 2026-11-01: 01:30 EDT (05:30Z), not also 01:30 EST (06:30Z).
    assert starts("30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z", 3) == [
        "2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_a_duration_is_elapsed_time_across_a_change() -> None:
    # Midnight in Berlin on the night the clocks go back (03:00 CEST -> 02:00 CET at 01:00Z) is 22:00Z; four
    # elapsed hours close at 02:00Z (03:00 CET on the wall), not at 04:00 wall time (03:00Z).
    windows = recurring("0 0 25 10 *", "4h", "Europe/Berlin")
    assert windows.open_until(at("2026-10-24T22:00:00Z")) == ("w", at("2026-10-25T02:00:00Z"))
    assert windows.open_until(at("2026-10-25T01:59:59Z")) == ("w", at("2026-10-25T02:00:00Z"))
    assert windows.open_until(at("2026-10-25T02:00:00Z")) is None


def test_the_same_schedule_in_two_zones_opens_at_two_instants() -> None:
    tokyo = recurring("0 3 * * *", zone="Asia/Tokyo").next_opening(at("2026-06-01T00:00:00Z"))
    utc = recurring("0 3 * * *").next_opening(at("2026-06-01T00:00:00Z"))
    assert tokyo == ("w", at("2026-06-01T18:00:00Z"))
    assert utc == ("w", at("2026-06-01T03:00:00Z"))


# ---- open, next, one-off ---------------------------------------------------------------------------------


def test_open_until_and_next_opening_of_recurring_and_one_off_windows() -> None:
    windows = Windows.from_cluster_spec({"maintenance": {"windows": [
        {"name": "nightly", "schedule": "0 1 * * *", "duration": "2h", "timeZone": "UTC"},
        {"name": "extra", "start": "2026-12-03T12:00:00Z", "end": "2026-12-03T14:30:00+00:00"},
    ]}})
    assert windows is not None
    assert windows.open_until(at("2026-12-03T01:00:00Z")) == ("nightly", at("2026-12-03T03:00:00Z"))
    assert windows.open_until(at("2026-12-03T03:00:00Z")) is None  # [start, start + duration)
    assert windows.next_opening(at("2026-12-03T03:00:00Z")) == ("extra", at("2026-12-03T12:00:00Z"))
    assert windows.open_until(at("2026-12-03T14:00:00Z")) == ("extra", at("2026-12-03T14:30:00Z"))
    assert windows.next_opening(at("2026-12-03T14:00:00Z")) == ("nightly", at("2026-12-04T01:00:00Z"))


def test_overlapping_windows_keep_it_open_until_the_last_closes() -> None:
    windows = Windows.from_cluster_spec({"maintenance": {"windows": [
        {"name": "a", "schedule": "0 1 * * *", "duration": "2h"},
        {"name": "b", "schedule": "0 2 * * *", "duration": "3h"},
    ]}})
    assert windows is not None
    assert windows.open_until(at("2026-12-03T02:30:00Z")) == ("b", at("2026-12-03T05:00:00Z"))


def test_a_window_longer_than_its_period_is_always_open() -> None:
    windows = recurring("0 * * * *", "90m")
    assert windows.open_until(at("2026-12-03T10:59:59Z")) == ("w", at("2026-12-03T11:30:00Z"))  # the 10:00 one
    assert all(windows.open_until(at("2026-12-03T10:00:00Z") + dt.timedelta(minutes=m)) is not None
               for m in range(0, 180, 7))


# ---- the spec and the verdict -------------------------------------------------------------------------


def test_no_windows_means_always_open() -> None:
    assert Windows.from_cluster_spec({}) is None
    assert Windows.from_cluster_spec({"maintenance": {}}) is None
    assert Windows.from_cluster_spec({"maintenance": {"windows": []}}) is None
    assert verdict({"metadata": {"name": "c"}, "spec": {}}, at("2026-12-03T10:00:00Z"), what="x", recheck=9) is None


@pytest.mark.parametrize(("entry", "says"), [
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Mars/Olympus"},
     r"windows\[0\].timeZone \(w\): 'Mars/Olympus' is not an IANA time zone"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "4 hours"}, r"windows\[0\].duration \(w\)"),
    ({"name": "w", "schedule": "0 22 * * SAT"}, r"windows\[0\].duration"),
    ({"name": "w", "schedule": "0 25 * * SAT", "duration": "1h"}, r"windows\[0\].schedule \(w\): hour: 25"),
    ({"name": "w", "start": "2026-12-03T10:00:00Z", "end": "2026-12-03T09:00:00Z"}, "is not after start"),
    ({"name": "w", "start": "tomorrow", "end": "2026-12-03T09:00:00Z"}, "not an RFC 3339 time"),
    ({"name": "w", "start": "2026-12-03T10:00:00", "end": "2026-12-03T11:00:00Z"}, "has no offset"),
    ({"name": "w", "start": "2026-12-03T10:00:00Z"}, "needs either schedule"),
    ({"name": "w", "schedule": "0 1 * * *", "duration": "1h", "start": "2026-12-03T10:00:00Z"}, "both a schedule"),
    ({"name": "w", "timeZone": "../../etc/passwd", "schedule": "0 1 * * *", "duration": "1h"},
     "not an IANA time zone"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "9999d"},
     r"windows\[0\].duration \(w\): '9999d' is longer than 7 days \(168h\), the longest a window lasts; for "
     "disruption at any time, remove spec.maintenance"),
    ({"name": "w", "schedule": "0 22 * * SAT", "duration": "7d1s"}, "longer than 7 days"),
    ({"name": "w", "start": "2026-12-03T10:00:00Z", "end": "2026-12-10T10:00:01Z"},
     r"windows\[0\].end \(w\): 2026-12-10T10:00:01Z is more than 7 days \(168h\) after start 2026-12-03T10:00:00Z; "
     "a window lasts at most a week"),
    ({"name": "w", "start": "2026-01-01T00:00:00Z", "end": "2099-01-01T00:00:00Z"}, "more than 7 days"),
])
def test_a_bad_window_is_named_and_blocks(entry: dict[str, object], says: str) -> None:
    spec = {"maintenance": {"windows": [entry]}}
    with pytest.raises(WindowSpecError, match=says):
        Windows.from_cluster_spec(spec)
    closed = verdict({"metadata": {"name": "c"}, "spec": spec}, at("2026-12-03T10:00:00Z"), what="x", recheck=9)
    assert closed is not None and closed.invalid and closed.after == 9
    assert "spec.maintenance.windows" in closed.message


def test_two_windows_of_one_name_are_refused_naming_both() -> None:
    # The CRD refuses them too (a list-type map keyed by name); a cluster stored before that is held here.
    weekly = {"name": "w", "schedule": "0 22 * * SAT", "duration": "4h"}
    one_off = {"name": "w", "start": "2026-12-03T10:00:00Z", "end": "2026-12-03T11:00:00Z"}
    with pytest.raises(WindowSpecError, match=r"^spec\.maintenance\.windows\[2\]\.name: 'w' is the name of "
                       r"spec\.maintenance\.windows\[0\] too; give each window a name of its own$"):
        Windows.from_cluster_spec({"maintenance": {"windows": [weekly, {**weekly, "name": "v"}, one_off]}})
    assert Windows.from_cluster_spec({"maintenance": {"windows": [{**weekly, "duration": "7d"}]}}) is not None


def test_the_verdict_names_the_next_opening_and_requeues_at_it_or_for_the_lock() -> None:
    cluster = {"metadata": {"name": "prod"}, "spec": {"maintenance": {"windows": [
        {"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Europe/Berlin"}]}}}
    closed = verdict(cluster, at("2026-12-05T20:59:30Z"), what="the reboot of w1", recheck=100)
    assert closed is not None and not closed.invalid
    assert closed.message == ("waiting for the maintenance window weekly to start the reboot of w1: it opens at "
                              "2026-12-05T21:00:00Z")
    assert closed.after == 30  # timed to the opening, not a poll
    assert verdict(cluster, at("2026-12-03T10:00:00Z"), what="x", recheck=100).after == 100  # type: ignore[union-attr]
    assert verdict(cluster, at("2026-12-05T21:00:00Z"), what="x", recheck=100) is None
    assert verdict(cluster, at("2026-12-06T00:59:59Z"), what="x", recheck=100) is None
    assert verdict(cluster, at("2026-12-06T01:00:00Z"), what="x", recheck=100) is not None


def test_a_step_starts_only_if_its_predicted_time_fits_in_what_is_left_of_the_window() -> None:
    cluster = {"metadata": {"name": "prod"}, "spec": {"maintenance": {"windows": [
        {"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h", "timeZone": "Europe/Berlin"}]}}}
    # Open until 2026-12-06T01:00:00Z; a node's step of 5 minutes.
    ends_at_the_end = verdict(cluster, at("2026-12-06T00:55:00Z"), what="x", recheck=1e9, need=lambda: 300)
    assert ends_at_the_end is None
    closed = verdict(cluster, at("2026-12-06T00:55:01Z"), what="the reboot of w1", recheck=1e9, need=lambda: 300)
    assert closed is not None and not closed.invalid
    assert closed.message == ("waiting for a maintenance window to start the reboot of w1: it takes about 300 s and "
                              "the window weekly closes in 299 s, at 2026-12-06T01:00:00Z; the next window, weekly, "
                              "opens at 2026-12-12T21:00:00Z")
    assert closed.after == (at("2026-12-12T21:00:00Z") - at("2026-12-06T00:55:01Z")).total_seconds()
    assert verdict(cluster, at("2026-12-06T00:55:01Z"), what="x", recheck=100, need=lambda: 300).after == 100  # type: ignore[union-attr]
    # A step longer than half the window is held to half of it: it starts in its first half (else it never would).
    assert verdict(cluster, at("2026-12-05T23:00:00Z"), what="x", recheck=100, need=lambda: 5 * 3600) is None
    assert verdict(cluster, at("2026-12-05T23:00:01Z"), what="x", recheck=100, need=lambda: 5 * 3600) is not None


def test_a_step_that_does_not_fit_the_last_one_off_window_says_none_lies_ahead() -> None:
    cluster = {"metadata": {"name": "c"}, "spec": {"maintenance": {"windows": [
        {"name": "once", "start": "2026-12-01T10:00:00Z", "end": "2026-12-01T11:00:00Z"}]}}}
    closed = verdict(cluster, at("2026-12-01T10:59:00Z"), what="x", recheck=1000, need=lambda: 120)
    assert closed is not None and closed.after == 60  # looks again at the end: then "no window lies ahead"
    assert closed.message.endswith(
        "the window once closes in 60 s, at 2026-12-01T11:00:00Z; no other window lies ahead")


def test_only_past_one_off_windows_say_none_lies_ahead() -> None:
    cluster = {"metadata": {"name": "c"}, "spec": {"maintenance": {"windows": [
        {"name": "once", "start": "2026-12-01T10:00:00Z", "end": "2026-12-01T11:00:00Z"}]}}}
    closed = verdict(cluster, at("2026-12-03T10:00:00Z"), what="x", recheck=7)
    assert closed is not None and not closed.invalid and closed.after == 7
    assert "no window of TalosCluster c lies ahead" in closed.message


def test_every_zone_the_database_knows_parses() -> None:
    # The image carries the tzdata wheel (pyproject): zoneinfo finds zones without /usr/share/zoneinfo.
    zones = zoneinfo.available_timezones()
    assert {"Europe/Berlin", "America/New_York", "Asia/Kolkata", "UTC"} <= zones
    window = Recurring("w", "0 0 * * *", parse_cron("0 0 * * *"), dt.timedelta(hours=1),
                       zoneinfo.ZoneInfo("Asia/Kolkata"))
    assert window.next_start(at("2026-01-01T00:00:00Z")) == at("2026-01-01T18:30:00Z")


def test_the_cluster_condition_says_what_the_spec_says_once() -> None:
    from ichord.api import names
    from ichord.operations.windows import cluster_condition

    spec = {"maintenance": {"windows": [{"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h"}]}}
    cond = cluster_condition({"metadata": {"name": "c"}, "spec": spec})
    assert cond is not None and (cond.status, cond.reason) == ("True", names.MaintenanceWindowsReason.VALID)
    assert "weekly" in cond.message
    said = {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message}
    assert cluster_condition({"metadata": {"name": "c"}, "spec": spec, "status": {"conditions": [said]}}) is None
    bad = {"maintenance": {"windows": [{"name": "weekly", "schedule": "0 22 * * SAT", "duration": "4h",
                                        "timeZone": "Europe/Berlim"}]}}
    cond = cluster_condition({"metadata": {"name": "c"}, "spec": bad, "status": {"conditions": [said]}})
    assert cond is not None and (cond.status, cond.reason) == ("False", names.MaintenanceWindowsReason.INVALID)
    assert "spec.maintenance.windows[0].timeZone (weekly)" in cond.message
    gone = cluster_condition({"metadata": {"name": "c"}, "spec": {}, "status": {"conditions": [said]}})
    assert gone is not None and gone.reason == names.MaintenanceWindowsReason.NONE
    assert cluster_condition({"metadata": {"name": "c"}, "spec": {}}) is None  # never had windows: nothing written
