"""Fault injection settings and the request log tests read counts from."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Faults:
    """What the simulated server does wrong; change the fields at any time during a run."""

    #: Added to every request before it is handled (seconds).
    latency: float = 0.0
    #: Probability (0..1) that a request of a verb (get, list, watch, create, update, patch, delete) fails; a key
    #: ``verb:resource`` (e.g. ``list:talosmachines``) narrows it to one resource and wins over the verb's own.
    error_rate: dict[str, float] = field(default_factory=dict)
    #: The status of an injected failure: 500 InternalError, 503 ServiceUnavailable, 429 TooManyRequests or
    #: 409 Conflict (as if another writer had won the race).
    error_code: int = 500
    #: The message of an injected failure (None: "injected fault: <verb> failed"); e.g. the 500 a webhook that
    #: timed out gives (docs/decisions.md#ca-rotation-passes): 'Internal error occurred: failed calling webhook "x": ...
    #: context deadline exceeded'.
    error_message: str | None = None
    #: After the server comes back up, requests for a CustomResourceDefinition's group answer 404 with no name
    #: for this long: the group is not served yet ("no matches for kind", docs/decisions.md#ca-rotation-passes).
    discovery_lag: float = 0.0
    #: Probability (0..1) that a request of a verb has its connection reset instead of an answer;
    #: ``reset_after`` resets it after the request was served (a write that happened, its answer lost).
    reset_rate: dict[str, float] = field(default_factory=dict)
    reset_after: bool = False
    #: Requests an RBAC authorizer would refuse, as (verb, resource[/subresource], namespace) with "*" for any
    #: verb or namespace: answered 403 Forbidden in kube-apiserver's words (the simulator has no authorizer).
    denied: set[tuple[str, str, str]] = field(default_factory=set)
    seed: int | None = None
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.seed is not None:
            self._rng.seed(self.seed)

    def reseed(self, seed: int) -> None:
        """Make the injected failures repeatable from here on."""
        self.seed = seed
        self._rng.seed(seed)

    def should_fail(self, verb: str, resource: str = "") -> bool:
        rate = self.error_rate.get(f"{verb}:{resource}", self.error_rate.get(verb, 0.0))
        return rate > 0 and self._rng.random() < rate

    def denies(self, verb: str, resource: str, namespace: str) -> bool:
        return any(v in ("*", verb) and r == resource and n in ("*", namespace) for v, r, n in self.denied)

    def should_reset(self, verb: str) -> bool:
        rate = self.reset_rate.get(verb, 0.0)
        return rate > 0 and self._rng.random() < rate


@dataclass(frozen=True)
class LoggedRequest:
    verb: str
    path: str
    status: int
    resource: str


@dataclass(frozen=True)
class Access:
    """One authenticated resource request as an RBAC authorizer sees it, and who made it.

    ``name`` is also set for a list or watch with ``fieldSelector=metadata.name=X``, as kube-apiserver's
    request info does (RBAC's resourceNames can then allow it).
    """

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str


class RequestLog:
    """Every request served: verb, path, status; counts for assertions and the benchmark.

    ``access`` records each resource request with the authenticated identity (the RBAC test reads it).
    """

    def __init__(self) -> None:
        self.entries: list[LoggedRequest] = []
        self.access: list[Access] = []

    def add(self, verb: str, path: str, status: int, resource: str = "") -> None:
        self.entries.append(LoggedRequest(verb, path, status, resource))

    def counts(self) -> Counter[tuple[str, int]]:
        return Counter((e.verb, e.status) for e in self.entries)

    def count(self, verb: str | None = None, status: int | None = None, resource: str | None = None) -> int:
        return sum(1 for e in self.entries
                   if (verb is None or e.verb == verb) and (status is None or e.status == status)
                   and (resource is None or e.resource == resource))

    def add_access(self, access: Access) -> None:
        self.access.append(access)

    def by_user(self, user: str) -> list[Access]:
        return [a for a in self.access if a.user == user]

    def users(self) -> set[str]:
        return {a.user for a in self.access}

    def clear(self) -> None:
        self.entries.clear()
        self.access.clear()
