"""Failpoints: ``ICHORD_FAILPOINTS=name[:n],...`` makes the process die (exit 137) at a named point.

Every step boundary of every operation calls ``failpoint(name)`` — after the status write and
before the call, after the call and before the status write — so the chaos tests can kill the
daemon exactly there and prove it resumes. ``n`` is the hit that kills (default 1st). The exit is
``os._exit``: no cleanup, no Lease release, like a SIGKILL.
"""

from __future__ import annotations

import os
import sys
import threading

from ichord.errors import IchordError

EXIT_CODE = 137


class FailpointSpecError(IchordError):
    pass


def parse(spec: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise FailpointSpecError(f"failpoint {item!r}: the count after ':' must be a whole number") from None
        if n < 1 or not name:
            raise FailpointSpecError(f"failpoint {item!r}: write name or name:n with n >= 1")
        out[name] = n
    return out


class Failpoints:
    def __init__(self, spec: str = "") -> None:
        self._armed = parse(spec)
        self._hits: dict[str, int] = {}
        self._lock = threading.Lock()

    def hit(self, name: str) -> None:
        if name not in self._armed:
            return
        with self._lock:
            self._hits[name] = self._hits.get(name, 0) + 1
            fire = self._hits[name] == self._armed[name]
        if fire:
            sys.stderr.write(f"ichord: failpoint {name} reached; exiting {EXIT_CODE}\n")
            sys.stderr.flush()
            os._exit(EXIT_CODE)


_ACTIVE = Failpoints(os.environ.get("ICHORD_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    _ACTIVE.hit(name)
