"""``maxUnavailable``: how many workers a ca-rotation pass or a config rollout changes at once (issue 19).

Written as Kubernetes writes a Deployment's ``maxUnavailable``: a whole number of at least 1, or a percentage
``"N%"`` (0 < N <= 100) of the cluster's workers, rounded down as Kubernetes rounds it, then at least one
worker and never more workers than there are. The value in force is the TalosOperation's
``spec.maxUnavailable``, else its TalosCluster's, else the daemon's ``--max-unavailable`` (default 25%).
Control planes are never concerned: they are always changed one at a time.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from ichord.errors import IchordError

_PERCENT = re.compile(r"(100|[1-9][0-9]?)%")
_WHOLE = re.compile(r"[0-9]+")
_EXPECTED = "a whole number of at least 1 or a percentage of the workers such as 25% (more than 0%, at most 100%)"


class MaxUnavailableError(IchordError):
    """A maxUnavailable value is neither a whole number of at least 1 nor a percentage in (0%, 100%]."""


@dataclass(frozen=True)
class MaxUnavailable:
    """One parsed value: exactly one of ``count`` (workers) and ``percent`` (of the workers) is set."""

    count: int | None = None
    percent: int | None = None

    def __post_init__(self) -> None:
        if (self.count is None) == (self.percent is None):
            raise MaxUnavailableError("maxUnavailable is either a count or a percentage")
        if self.count is not None and self.count < 1:
            raise MaxUnavailableError(f"maxUnavailable must be {_EXPECTED}, got {self.count}")
        if self.percent is not None and not 0 < self.percent <= 100:
            raise MaxUnavailableError(f"maxUnavailable must be {_EXPECTED}, got {self.percent}%")

    @classmethod
    def parse(cls, value: Any, *, field: str = "maxUnavailable") -> MaxUnavailable:
        """A value as the API holds it (an int-or-string): an int >= 1 or a string ``"N%"``.

        A string of digits is refused as Kubernetes refuses it ("not a percentage"): "4" is not 4 in YAML."""
        if isinstance(value, int) and not isinstance(value, bool):
            if value >= 1:
                return cls(count=value)
        elif isinstance(value, str) and _PERCENT.fullmatch(value):
            return cls(percent=int(value[:-1]))
        raise MaxUnavailableError(f"{field} must be {_EXPECTED}, got {value!r}")

    @classmethod
    def parse_text(cls, text: str, *, field: str = "--max-unavailable") -> MaxUnavailable:
        """A value written on a command line or in the environment: digits are a count, ``N%`` a percentage."""
        text = text.strip()
        return cls.parse(int(text) if _WHOLE.fullmatch(text) else text, field=field)

    def workers_at_once(self, workers: int) -> int:
        """The bound over ``workers`` workers: a percentage rounded down, at least 1, at most ``workers`` (if any)."""
        at_once = self.count if self.count is not None else workers * (self.percent or 0) // 100
        at_once = max(1, at_once)
        return min(at_once, workers) if workers > 0 else at_once

    def to_api(self) -> int | str:
        """As written in a spec: ``4`` or ``"25%"``."""
        return self.count if self.count is not None else f"{self.percent}%"

    def __str__(self) -> str:
        return str(self.to_api())


#: The daemon's default when neither the operation nor its cluster says (issue 19: "default 25 %").
DEFAULT = MaxUnavailable(percent=25)


class Source(enum.StrEnum):
    """Where the value in force was written."""

    OPERATION = "operation"
    CLUSTER = "cluster"
    DAEMON = "daemon"


_SOURCE_WORDS = {Source.OPERATION: "the operation's", Source.CLUSTER: "the TalosCluster's",
                 Source.DAEMON: "the daemon's --max-unavailable"}


@dataclass(frozen=True)
class WorkerBound:
    """The bound resolved for one cluster's workers: what is changed at once, and why."""

    at_once: int
    value: MaxUnavailable
    source: Source
    workers: int

    def describe(self) -> str:
        """E.g. "workers 25 at a time (maxUnavailable 25% of 100 workers, the daemon's --max-unavailable)"."""
        of = f" of {self.workers} workers" if self.value.percent is not None else ""
        return (f"workers {self.at_once} at a time (maxUnavailable {self.value}{of}, "
                f"{_SOURCE_WORDS[self.source]})")

    def to_status(self) -> dict[str, Any]:
        """``status.plan.workerBound``: the bound as resolved when the plan was written."""
        return {"atOnce": self.at_once, "maxUnavailable": str(self.value), "source": self.source.value,
                "workers": self.workers, "message": self.describe()}


def resolve(operation_value: Any, cluster_value: Any, default: MaxUnavailable, workers: int) -> WorkerBound:
    """The bound over ``workers``: the operation's value, else the cluster's, else ``default`` (None = not set).

    Only the value in force is parsed: a bad one raises MaxUnavailableError naming where it was written."""
    if operation_value is not None:
        value, source = MaxUnavailable.parse(operation_value, field="the TalosOperation's spec.maxUnavailable"), \
            Source.OPERATION
    elif cluster_value is not None:
        value, source = MaxUnavailable.parse(cluster_value, field="the TalosCluster's spec.maxUnavailable"), \
            Source.CLUSTER
    else:
        value, source = default, Source.DAEMON
    return WorkerBound(value.workers_at_once(workers), value, source, workers)
