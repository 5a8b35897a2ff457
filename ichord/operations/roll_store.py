"""A MarkerStore on a custom object's status, through the one status patch helper (ichord/kube/status.py).

The fields default to the etcd roll's (docs/decisions.md#etcd-reboot-roll, the CRD): ``status.caRotation.etcdRebooting``
(the machine), ``etcdRebootBootID``, ``etcdRestartedAt`` (when the reboot was requested, RFC 3339 with
microseconds: the bounds are measured from it) and ``etcdRestarted`` (append-only list of machines done).
Cleared fields are removed (merge-patch null), ``etcdRestartedAt`` is kept as the last request's time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from ichord.errors import IchordError
from ichord.kube.crds import CustomObjects
from ichord.kube.status import update_status
from ichord.operations.roll_state import RollMarker


class MarkerFormatError(IchordError):
    """The stored marker cannot be read (a hand edit?); the message names the field."""


@dataclass(frozen=True)
class MarkerFields:
    """Where each part of the marker lives under ``status.<section>``."""

    section: str = "caRotation"
    rebooting: str = "etcdRebooting"
    boot_id: str = "etcdRebootBootID"
    requested_at: str = "etcdRestartedAt"
    done: str = "etcdRestarted"
    #: Where ``RollMarker.staged_at`` is kept ("" = not kept: the etcd roll applies nothing before its reboots).
    staged_at: str = ""


def format_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(raw: str, where: str) -> datetime:
    try:
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise MarkerFormatError(f"{where} is not an RFC 3339 time: {raw!r}") from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def marker_from_status(status: dict[str, Any], fields: MarkerFields = MarkerFields()) -> RollMarker:
    section = status.get(fields.section) or {}
    raw_at = section.get(fields.requested_at)
    at = parse_time(str(raw_at), f"status.{fields.section}.{fields.requested_at}") if raw_at else None
    raw_staged = section.get(fields.staged_at) if fields.staged_at else None
    staged = parse_time(str(raw_staged), f"status.{fields.section}.{fields.staged_at}") if raw_staged else None
    return RollMarker(rebooting=str(section.get(fields.rebooting) or ""),
                      boot_id=str(section.get(fields.boot_id) or ""), requested_at=at,
                      done=tuple(str(m) for m in section.get(fields.done) or ()), staged_at=staged)


def status_with_marker(status: dict[str, Any], marker: RollMarker,
                       fields: MarkerFields = MarkerFields()) -> dict[str, Any]:
    """``status`` with the marker written in (a copy); cleared fields set to None so the merge patch removes them."""
    out = copy.deepcopy(status)
    section = dict(out.get(fields.section) or {})
    section[fields.rebooting] = marker.rebooting or None
    section[fields.boot_id] = marker.boot_id or None
    if marker.requested_at is not None:
        section[fields.requested_at] = format_time(marker.requested_at)
    if fields.staged_at and marker.staged_at is not None:
        section[fields.staged_at] = format_time(marker.staged_at)
    section[fields.done] = list(marker.done)
    out[fields.section] = section
    return out


def _same(stored: RollMarker, marker: RollMarker, fields: MarkerFields) -> bool:
    """The record says ``marker`` already (its staged_at compared only where the fields keep one)."""
    return stored == (marker if fields.staged_at else replace(marker, staged_at=None))


class StatusMarkerStore:
    """MarkerStore on ``<kind> namespace/name`` status (read uncached; every write retries conflicts)."""

    def __init__(self, objects: CustomObjects, namespace: str, name: str,
                 fields: MarkerFields = MarkerFields()) -> None:
        self._objects = objects
        self._namespace = namespace
        self._name = name
        self._fields = fields

    async def read(self) -> RollMarker:
        obj = await self._objects.get(self._namespace, self._name)
        return marker_from_status(obj.get("status") or {}, self._fields)

    async def write(self, marker: RollMarker) -> None:
        def mutate(status: dict[str, Any], _: dict[str, Any]) -> dict[str, Any] | None:
            if _same(marker_from_status(status, self._fields), marker, self._fields):
                return None
            return status_with_marker(status, marker, self._fields)
        await update_status(self._objects, self._namespace, self._name, mutate)
