"""The hand-off's transient-error retry (docs/decisions.md#ca-rotation-passes).

Every API call of ``ichord cluster credentials`` goes through ``Retrier.call``: a transient failure
(the API server restarting for the new CA, a webhook that timed out, a group not served yet) is
retried with backoff for up to the window, and the operator is told once that the command waits.
An answer (401, 403, an object's 404, 422, a webhook that denied the request) stops at once.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio

from ichord.errors import RuntimeFailure
from ichord.kube.client import NoTrustError
from ichord.kube.errors import KubeError, NotFound, TLSVerificationError, TooManyRequests, Unavailable
from ichord.pki.scrub import SCRUBBER
from ichord.talos.errors import TalosError, TalosUnreachableError

T = TypeVar("T")

#: docs/decisions.md#credentials-handoff: retryTransient's backoff, 1 s doubling to 15 s, for up to 10 minutes.
DEFAULT_DELAYS = (1.0, 15.0)
DEFAULT_WINDOW = 600.0

# A 500 with one of these is a webhook or etcd that did not answer in time, not an answer.
_TRANSIENT_500 = ("failed calling webhook", "context deadline exceeded", "timeout", "timed out",
                  "connection refused", "etcdserver: leader changed", "no matches for",
                  "unable to retrieve the complete list of server apis")
# A webhook that answered "no" is an answer, whatever the status code it came with.
_REFUSAL = "denied the request"


class Verdict(enum.Enum):
    TRANSIENT = "transient"
    FINAL = "final"


def classify(exc: BaseException) -> Verdict:
    """Whether a failed call is worth repeating (pure: looks only at the error's type, code and text)."""
    if isinstance(exc, TalosError):
        # The node is restarting or not reachable yet; a refused certificate is an answer.
        return Verdict.TRANSIENT if isinstance(exc, TalosUnreachableError) else Verdict.FINAL
    if not isinstance(exc, KubeError):
        return Verdict.FINAL
    text = str(exc).lower()
    if _REFUSAL in text:
        return Verdict.FINAL
    if isinstance(exc, TLSVerificationError | NoTrustError):
        return Verdict.FINAL  # the trust must change; waiting does not change it
    if isinstance(exc, NotFound):
        # An object's 404 names it (details.name); a 404 without a name is the resource type not being
        # served yet (the CRD group missing from discovery while kube-apiserver comes back).
        return Verdict.FINAL if (exc.details or {}).get("name") else Verdict.TRANSIENT
    if isinstance(exc, TooManyRequests):
        return Verdict.TRANSIENT
    if isinstance(exc, Unavailable):
        if exc.status in (0, 502, 503, 504):
            return Verdict.TRANSIENT  # refused, reset, timed out, or the server said "not now"
        if exc.status == 500 and any(marker in text for marker in _TRANSIENT_500):
            return Verdict.TRANSIENT
    return Verdict.FINAL


class RetryWindowExceeded(RuntimeFailure):
    """Transient failures went on for the whole window; the message names the call and the last error."""


@dataclass
class Retrier:
    """Repeats calls that fail transiently, for up to ``window`` seconds from a call's first failure."""

    window: float = DEFAULT_WINDOW
    say: Callable[[str], None] = print
    delays: tuple[float, float] = DEFAULT_DELAYS
    clock: Callable[[], float] = time.monotonic
    announced: bool = field(default=False, init=False)

    async def call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()``; a final error is raised as is, a transient one is retried until the window ends."""
        first, longest = self.delays
        delay = first
        deadline: float | None = None
        while True:
            try:
                return await fn()
            except (KubeError, TalosError) as exc:
                if classify(exc) is Verdict.FINAL:
                    raise
                now = self.clock()
                deadline = now + self.window if deadline is None else deadline
                if now >= deadline:
                    raise RetryWindowExceeded(
                        f"{what}: still failing after {self.window:.0f} s of transient errors; the last was "
                        f"{type(exc).__name__}: {SCRUBBER.text(str(exc))}. Check that the API server is up and "
                        "run the command again") from None
                if not self.announced:
                    self.announced = True
                    api = "Talos" if isinstance(exc, TalosError) else "Kubernetes"
                    self.say(f"waiting for the {api} API ({what}: {_short(exc)}); retrying for up to "
                             f"{self.window:.0f} s")
                await anyio.sleep(max(0.0, min(delay, deadline - now)))
                delay = min(delay * 2, longest)


def _short(exc: BaseException) -> str:
    return SCRUBBER.text(str(exc))[:200]
