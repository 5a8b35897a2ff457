"""Whether this process can reach and verify its Kubernetes API server, for /readyz.

Every request the client makes reports here: an HTTP answer of any status means the server was reached
over a verified TLS connection; a refused connection, a reset, a timeout or a certificate the trust set
does not hold is a failure. ``/readyz`` fails once failures alone have been seen for longer than a short
grace (an API server restart must not flap the probe), so a replica locked out by a CA it does not trust
is taken out of rotation and shows up in ``kubectl get pods`` instead of answering 200 while stuck.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ichord.kube.errors import KubeError, from_exception


class Reachability:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last_ok: float | None = None
        self.failing_since: float | None = None
        self.last_error = ""

    def ok(self) -> None:
        self.last_ok = self._clock()
        self.failing_since = None
        self.last_error = ""

    def failed(self, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = self._clock()
        try:
            err = exc if isinstance(exc, KubeError) else from_exception(exc)
            self.last_error = str(err)
        except TypeError:
            self.last_error = type(exc).__name__

    def failing_for(self) -> float:
        """Seconds since requests started failing with no success in between (0 while they succeed)."""
        return 0.0 if self.failing_since is None else self._clock() - self.failing_since

    def since_ok(self) -> float | None:
        return None if self.last_ok is None else self._clock() - self.last_ok

    def reachable(self, grace: float) -> bool:
        return self.failing_for() <= grace
