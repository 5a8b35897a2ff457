"""Kubernetes-style conditions (metav1.Condition) kept the way apimachinery's SetStatusCondition does.

lastTransitionTime changes only when the status changes, so timers measured from it (settle delays,
bounds) survive restarts and are not reset by a rewritten message.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ichord.pki.scrub import scrub_text


def now_rfc3339(now: dt.datetime | None = None) -> str:
    t = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).replace(microsecond=0)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


#: The longest message a condition, an operation's status.message or a gate's verdict carries (an Event's bound,
#: kube/events.py): a person reads it in `kubectl describe`, and what caused it is in the log.
MAX_MESSAGE = 1024


def bounded_message(text: str) -> str:
    """``text`` as a status may carry it: within MAX_MESSAGE characters (scrubbed before it is cut, so no secret is
    cut in a way the scrubber no longer sees), saying how much was left out."""
    if len(text) <= MAX_MESSAGE:
        return text
    clean = scrub_text(text)
    if len(clean) <= MAX_MESSAGE:
        return clean
    room = MAX_MESSAGE - len(f"… ({len(clean)} more characters)")  # the count is never longer than the length
    return f"{clean[:room]}… ({len(clean) - room} more characters)"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""

    def __post_init__(self) -> None:
        # Bounded where it is made, so that every comparison with the message as written sees the same text.
        object.__setattr__(self, "message", bounded_message(self.message))

    def as_dict(self, transition_time: str, observed_generation: int | None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": scrub_text(self.message),
            "lastTransitionTime": transition_time,
        }
        if observed_generation is not None:
            d["observedGeneration"] = observed_generation
        return d


def find(conditions: list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    for c in conditions or []:
        if c.get("type") == ctype:
            return c
    return None


def set_condition(
    conditions: list[dict[str, Any]] | None,
    cond: Condition,
    *,
    observed_generation: int | None = None,
    now: dt.datetime | None = None,
) -> list[dict[str, Any]]:
    """A new list with ``cond`` set; the transition time kept when the status did not change."""
    out = [dict(c) for c in conditions or [] if c.get("type") != cond.type]
    old = find(conditions, cond.type)
    transition = (
        str(old["lastTransitionTime"])
        if old is not None and old.get("status") == cond.status and old.get("lastTransitionTime")
        else now_rfc3339(now)
    )
    out.append(cond.as_dict(transition, observed_generation))
    out.sort(key=lambda c: str(c.get("type")))
    return out


#: The TalosOperation's terminal condition (the CRDs), derived from its phase in one place so that
#: `kubectl wait --for=condition=Succeeded` ends on success and `--for=condition=Succeeded=false` on failure.
_SUCCEEDED_BY_PHASE = {"Completed": ("True", "Completed"), "Failed": ("False", "Failed")}


def set_operation_phase(status: dict[str, Any], phase: str, message: str, *, now: dt.datetime | None = None,
                        observed_generation: int | None = None) -> None:
    """Write a TalosOperation's phase and message, and its Succeeded condition with them (Unknown while running)."""
    status["phase"] = phase
    status["message"] = scrub_text(bounded_message(message))
    value, reason = _SUCCEEDED_BY_PHASE.get(phase, ("Unknown", phase or "Pending"))
    status["conditions"] = set_condition(status.get("conditions"), Condition("Succeeded", value, reason, message),
                                         now=now, observed_generation=observed_generation)
    if observed_generation is not None:
        status["observedGeneration"] = observed_generation


def is_true(conditions: list[dict[str, Any]] | None, ctype: str) -> bool:
    c = find(conditions, ctype)
    return c is not None and c.get("status") == "True"
