"""Maintenance windows: ``spec.maintenance.windows`` of the TalosCluster (docs/decisions.md#maintenance-windows).

A disruptive step (a node's cordon, a reboot of a node no one cordoned, an apply that restarts kube-apiserver, a
CA-rotation pass) starts only while a window is open. A step already started finishes: the node in flight is never
abandoned mid-reboot or left cordoned between nodes, because the question is asked only before a node is *started*
(the roll asks it last before its cordon, on the step's clock as it reads then, never of a node it cordoned); a node
starts only if its predicted step fits in what is left of the window (``fits``; the prediction is the caller's:
operations/backbone.py ``predicted_step``). Outside a window the operation stays at that safe
point: phase InProgress, its condition reason ``WaitingForWindow`` naming the next window's start, one Normal Event
(a planned wait, never a Warning), and a requeue timed to the opening (or to the cluster lock's renewal, which
every step of a running operation owes: whichever comes first).

Windows::

    recurring   schedule (cron, 5 fields, in timeZone) + duration: open from each start for duration
    one-off     start + end (RFC 3339): open in [start, end)

No windows at all: always open (nothing changes for a cluster without the field). Times are the step's clock
(``ctx.now()``): tests drive windows of seconds with an injected clock.

Cron: minute hour day-of-month month day-of-week; ``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, ``a/n`` and lists;
month names JAN-DEC and day names SUN-SAT; 0 or 7 is Sunday. As in Vixie cron, when both day fields are
restricted a day matches either. The parser is ichord's own (about a hundred lines, tested in
tests/unit/test_windows.py) rather than croniter: what ichord needs is the window maths around it, with its own
rules for daylight saving time, which a library's iterator would have to be wrapped for anyway:

- a start in a skipped hour (spring forward) opens when the skipped hour ends (the first instant after the gap);
- a start in a repeated hour (fall back) opens once, at its first occurrence;
- a duration is elapsed time: a 4h window across a change is open four real hours.

Invalid windows (a cron field out of range, a zone not in the IANA database, a duration that is not one or lasts
more than 7 days, a one-off window whose end is not after its start or more than 7 days after it, two windows of one
name) are a spec a person must fix: nothing disruptive starts; the operation
says which field is wrong (a Warning, since it needs a person), as a spec the CRD schema could not catch (or a
cluster stored before the schema caught it).
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ichord.api import names
from ichord.api.conditions import Condition, find
from ichord.api.names import MaintenanceWindowsReason
from ichord.errors import IchordError

Obj = dict[str, Any]
UTC = dt.UTC

#: How far ahead a recurring window's next start is looked for (a "29 Feb" start recurs within 8 years).
_HORIZON_DAYS = 366 * 8 + 2
_DURATION = re.compile(r"^(?:[1-9][0-9]*[dhms])+$")
_PART = re.compile(r"([1-9][0-9]*)([dhms])")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MONTHS = {m: i + 1 for i, m in enumerate(("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                                           "NOV", "DEC"))}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
#: The longest a window lasts (the CRD's rules): a weekly window closes before it opens again, and a one-off window
#: longer than a week is no window (for "at any time" there is no spec.maintenance).
MAX_DURATION = dt.timedelta(days=7)


class WindowSpecError(IchordError):
    """spec.maintenance.windows cannot be followed: the message names the field and what is wrong."""


# ---- cron ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        by_dom = day.day in self.days
        by_dow = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return by_dom or by_dow  # Vixie cron: either day field
        return by_dom and by_dow


def _value(text: str, lo: int, hi: int, names: dict[str, int], what: str) -> int:
    upper = text.upper()
    if upper in names:
        return names[upper]
    if not text.isdigit():
        raise WindowSpecError(f"{what}: {text!r} is not a number from {lo} to {hi}")
    value = int(text)
    if not lo <= value <= hi:
        raise WindowSpecError(f"{what}: {value} is out of range {lo}-{hi}")
    return value


def _field(text: str, lo: int, hi: int, what: str, names: dict[str, int] | None = None) -> frozenset[int]:
    names = names or {}
    out: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise WindowSpecError(f"{what}: the step {step_text!r} in {item!r} is not a whole number above 0")
            step = int(step_text)
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _value(a, lo, hi, names, what), _value(b, lo, hi, names, what)
            if first > last:
                raise WindowSpecError(f"{what}: the range {base!r} runs backwards")
        elif base:
            first = _value(base, lo, hi, names, what)
            last = hi if step_text else first
        else:
            raise WindowSpecError(f"{what}: an empty item in {text!r}")
        out.update(range(first, last + 1, step))
    return frozenset(out)


def parse_cron(text: str) -> Cron:
    """Five fields, as cron(5) reads them; a WindowSpecError naming the field otherwise."""
    parts = text.split()
    if len(parts) != 5:
        raise WindowSpecError(f"{text!r} has {len(parts)} fields; a schedule has five: minute hour day-of-month month "
                              "day-of-week, e.g. \"0 22 * * SAT\"")
    minute, hour, dom, month, dow = parts
    weekdays = _field(dow, 0, 7, "day-of-week", _DAYS)
    return Cron(minutes=_field(minute, 0, 59, "minute"), hours=_field(hour, 0, 23, "hour"),
                days=_field(dom, 1, 31, "day-of-month"), months=_field(month, 1, 12, "month", _MONTHS),
                weekdays=frozenset(d % 7 for d in weekdays), days_restricted=dom != "*",
                weekdays_restricted=dow != "*")


# ---- local time to UTC, with the daylight-saving rules ---------------------------------------------------


def _to_utc(naive: dt.datetime, zone: zoneinfo.ZoneInfo) -> dt.datetime:
    """The instant a local wall-clock time names: the first of two (fold=0) in a repeated hour; the end of the gap
    for a time a spring-forward skips."""
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return first
    # Skipped: fold=1 reads it with the offset after the change (an instant before the gap), fold=0 with the offset
    # before it (an instant after the gap). The gap ends where the offset changes, between the two.
    lo = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = first
    if lo > hi:
        lo, hi = hi, lo
    after = hi.astimezone(zone).utcoffset()
    while hi - lo > dt.timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


# ---- windows --------------------------------------------------------------------------------------------


def parse_duration(text: str, what: str) -> dt.timedelta:
    if not _DURATION.match(text):
        raise WindowSpecError(f"{what}: {text!r} is not a duration; write whole numbers with units d, h, m or s, "
                              "such as 4h or 1h30m")
    return dt.timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in _PART.findall(text)))


def _parse_time(text: str, what: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise WindowSpecError(f"{what}: {text!r} is not an RFC 3339 time such as 2026-12-24T22:00:00Z") from None
    if value.tzinfo is None:
        raise WindowSpecError(f"{what}: {text!r} has no offset; write Z or +01:00")
    return value.astimezone(UTC)


@dataclass(frozen=True)
class Recurring:
    name: str
    schedule: str
    cron: Cron
    duration: dt.timedelta
    zone: zoneinfo.ZoneInfo

    def starts(self, since: dt.datetime) -> Iterator[dt.datetime]:
        """The window's starts at or after ``since`` (UTC), in order, within the horizon."""
        local_day = since.astimezone(self.zone).date() - dt.timedelta(days=1)
        for offset in range(_HORIZON_DAYS):
            day = local_day + dt.timedelta(days=offset)
            if not self.cron.matches_day(day):
                continue
            found = sorted({_to_utc(dt.datetime(day.year, day.month, day.day, h, m), self.zone)
                            for h in self.cron.hours for m in self.cron.minutes})
            for start in found:
                if start >= since:
                    yield start

    def span_at(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
        """The start and end of this window's occurrence holding ``now`` that ends last, if one does."""
        span = None
        for start in self.starts(now - self.duration):
            if start > now:
                break
            if now < start + self.duration and (span is None or start + self.duration > span[1]):
                span = (start, start + self.duration)
        return span

    def next_start(self, now: dt.datetime) -> dt.datetime | None:
        return next((s for s in self.starts(now) if s > now), None)


@dataclass(frozen=True)
class OneOff:
    name: str
    start: dt.datetime
    end: dt.datetime


@dataclass(frozen=True)
class Windows:
    recurring: tuple[Recurring, ...]
    one_off: tuple[OneOff, ...]

    @classmethod
    def from_cluster_spec(cls, spec: Obj) -> Windows | None:
        """None when the cluster has no windows (always open); WindowSpecError naming the field otherwise."""
        section = (spec.get("maintenance") or {})
        entries = section.get("windows") if isinstance(section, dict) else None
        if not entries:
            return None
        if not isinstance(entries, list):
            raise WindowSpecError("spec.maintenance.windows must be a list")
        recurring: list[Recurring] = []
        one_off: list[OneOff] = []
        named: dict[str, int] = {}
        for i, entry in enumerate(entries):
            where = f"spec.maintenance.windows[{i}]"
            if not isinstance(entry, dict):
                raise WindowSpecError(f"{where} must be an object")
            name = str(entry.get("name") or f"#{i}")
            if name in named:  # messages and Events name a window by its name
                raise WindowSpecError(f"{where}.name: {name!r} is the name of spec.maintenance.windows[{named[name]}] "
                                      "too; give each window a name of its own")
            named[name] = i
            if entry.get("schedule") is not None:
                if entry.get("start") is not None or entry.get("end") is not None:
                    raise WindowSpecError(f"{where} ({name}) has both a schedule and a start/end; give one")
                try:
                    cron = parse_cron(str(entry["schedule"]))
                except WindowSpecError as exc:
                    raise WindowSpecError(f"{where}.schedule ({name}): {exc}") from None
                duration = parse_duration(str(entry.get("duration") or ""), f"{where}.duration ({name})")
                if duration > MAX_DURATION:
                    raise WindowSpecError(f"{where}.duration ({name}): {entry['duration']!r} is longer than 7 days "
                                          "(168h), the longest a window lasts; for disruption at any time, remove "
                                          "spec.maintenance")
                zone_name = str(entry.get("timeZone") or "UTC")
                try:
                    zone = zoneinfo.ZoneInfo(zone_name)
                except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                    raise WindowSpecError(f"{where}.timeZone ({name}): {zone_name!r} is not an IANA time zone such "
                                          "as Europe/Berlin or UTC") from None
                window = Recurring(name, str(entry["schedule"]), cron, duration, zone)
                if window.next_start(dt.datetime(2000, 1, 1, tzinfo=UTC)) is None:
                    raise WindowSpecError(f"{where}.schedule ({name}): {window.schedule!r} never matches a day "
                                          "(such as 31 February)")
                recurring.append(window)
            elif entry.get("start") is not None and entry.get("end") is not None:
                start = _parse_time(str(entry["start"]), f"{where}.start ({name})")
                end = _parse_time(str(entry["end"]), f"{where}.end ({name})")
                if end <= start:
                    raise WindowSpecError(f"{where} ({name}): end {entry['end']} is not after start {entry['start']}")
                if end - start > MAX_DURATION:
                    raise WindowSpecError(f"{where}.end ({name}): {entry['end']} is more than 7 days (168h) after "
                                          f"start {entry['start']}; a window lasts at most a week (for \"at any "
                                          "time\", remove spec.maintenance)")
                one_off.append(OneOff(name, start, end))
            else:
                raise WindowSpecError(f"{where} ({name}) needs either schedule, duration and timeZone, or start and "
                                      "end")
        return cls(tuple(recurring), tuple(one_off))

    def open_until(self, now: dt.datetime) -> tuple[str, dt.datetime] | None:
        """The open window holding ``now`` that closes last: its name and its end; None when none is open."""
        span = self.open_span(now)
        return None if span is None else (span[0], span[2])

    def open_span(self, now: dt.datetime) -> tuple[str, dt.datetime, dt.datetime] | None:
        """The open window holding ``now`` that closes last: its name, its start and its end; None when none is."""
        best: tuple[str, dt.datetime, dt.datetime] | None = None
        for r in self.recurring:
            span = r.span_at(now)
            if span is not None and (best is None or span[1] > best[2]):
                best = (r.name, *span)
        for o in self.one_off:
            if o.start <= now < o.end and (best is None or o.end > best[2]):
                best = (o.name, o.start, o.end)
        return best

    def next_opening(self, now: dt.datetime) -> tuple[str, dt.datetime] | None:
        """The next window to open after ``now``: its name and its start; None when no window lies ahead."""
        found: list[tuple[dt.datetime, str]] = []
        for r in self.recurring:
            start = r.next_start(now)
            if start is not None:
                found.append((start, r.name))
        found.extend((o.start, o.name) for o in self.one_off if o.start > now)
        if not found:
            return None
        start, name = min(found)
        return name, start


# ---- the verdict a step asks for ----------------------------------------------------------------------


@dataclass(frozen=True)
class Closed:
    """No window is open: what the operation says while it waits, and when to look again (seconds)."""

    message: str
    after: float
    invalid: bool = False  # the windows cannot be read: a person must fix the spec (a Warning)


def _stamp(when: dt.datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fits(need: float, start: dt.datetime, end: dt.datetime, now: dt.datetime) -> bool:
    """May a step predicted to take ``need`` seconds start at ``now`` in the window open from ``start`` to ``end``?
    Yes when it ends before the window does. A step predicted longer than half the window is held to half of it
    (it starts in the window's first half): else a window shorter than a node's step would never start one."""
    room = (end - now).total_seconds()
    return min(need, (end - start).total_seconds() / 2) <= room


def verdict(cluster: Obj, now: dt.datetime, *, what: str, recheck: float,
            need: Callable[[], float] = lambda: 0.0) -> Closed | None:
    """None when ``what`` (e.g. "reboot cp-2") may start now; else why not. ``recheck``: the longest requeue (the
    cluster lock must be renewed by a step before it lapses). ``need``: the seconds ``what`` is predicted to take
    (0: only the window's being open is asked), asked only while a window is open; it starts only if it fits in
    what is left of the window (``fits``).
    ``now`` is the step's clock at the moment of the call the window admits: read right before it, never earlier in
    the step."""
    spec = cluster.get("spec") or {}
    name = str((cluster.get("metadata") or {}).get("name") or "")
    try:
        windows = Windows.from_cluster_spec(spec)
    except WindowSpecError as exc:
        return Closed(f"not starting {what}: the maintenance windows of TalosCluster {name} cannot be read: {exc}; "
                      "fix spec.maintenance.windows (`kubectl explain taloscluster.spec.maintenance.windows`)",
                      recheck, invalid=True)
    if windows is None:
        return None
    span = windows.open_span(now)
    seconds = need() if span is not None else 0.0
    if span is not None and fits(seconds, span[1], span[2], now):
        return None
    ahead = windows.next_opening(now)
    if span is not None:
        window, _, end = span
        left = max(0.0, (end - now).total_seconds())
        then = f"; the next window, {ahead[0]}, opens at {_stamp(ahead[1])}" if ahead is not None else (
            "; no other window lies ahead")
        wait = (ahead[1] - now).total_seconds() if ahead is not None else left
        return Closed(f"waiting for a maintenance window to start {what}: it takes about {seconds:.0f} s and the "
                      f"window {window} closes in {left:.0f} s, at {_stamp(end)}{then}", max(0.0, min(wait, recheck)))
    if ahead is None:
        return Closed(f"waiting for a maintenance window to start {what}: no window of TalosCluster {name} lies "
                      "ahead (every one-off window has passed); add one to spec.maintenance.windows", recheck)
    window, start = ahead
    wait = max(0.0, (start - now).total_seconds())
    return Closed(f"waiting for the maintenance window {window} to start {what}: it opens at {_stamp(start)}",
                  min(wait, recheck))


def cluster_condition(cluster: Obj) -> Condition | None:
    """The TalosCluster's MaintenanceWindows condition as its spec now says, or None when there is nothing to write
    (it already says so, or the cluster never had windows)."""
    spec, status = cluster.get("spec") or {}, cluster.get("status") or {}
    meta = cluster.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "default")
    existing = find(status.get("conditions"), names.MAINTENANCE_WINDOWS)
    try:
        windows = Windows.from_cluster_spec(spec)
    except WindowSpecError as exc:
        cond = Condition(names.MAINTENANCE_WINDOWS, "False", MaintenanceWindowsReason.INVALID,
                         f"{exc}: no disruptive step of any operation starts until it is fixed (`kubectl explain "
                         "taloscluster.spec.maintenance.windows`, then "
                         f"`kubectl -n {namespace} edit taloscluster {name}`)")
    else:
        if windows is None:
            if existing is None:
                return None
            cond = Condition(names.MAINTENANCE_WINDOWS, "False", MaintenanceWindowsReason.NONE,
                             "no maintenance windows: operations disrupt the cluster whenever they run")
        else:
            listed = ", ".join([w.name for w in windows.recurring] + [w.name for w in windows.one_off])
            cond = Condition(names.MAINTENANCE_WINDOWS, "True", MaintenanceWindowsReason.VALID,
                             f"disruptive steps start only inside the maintenance windows {listed}")
    if existing is not None and (existing.get("status"), existing.get("reason"), existing.get("message")) == (
            cond.status, cond.reason, cond.message):
        return None
    return cond
