"""Free loopback address blocks, so many simulated environments can run side by side.

Linux routes all of 127.0.0.0/8 to the loopback interface, so each environment takes its own
``127.A.B.`` block and its nodes keep the real ports (apid 50000, kube-apiserver 6443).
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Sequence

from ichord.errors import IchordError


class NoFreeLoopbackBlockError(IchordError):
    """No block had every needed address:port free."""


def free(host: str, port: int) -> bool:
    """True when ``host:port`` can be bound now (nothing listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_loopback_block(last_octets: Sequence[int], ports: Sequence[int] = (50000, 6443), *,
                        attempts: int = 50, rng: random.Random | None = None) -> str:
    """A prefix ``127.A.B.`` whose addresses ``last_octets`` have every port in ``ports`` free.

    Blocks are picked at random outside 127.0.0.0/24 (where fixed-address tests and `ichord sim` live),
    so parallel test processes rarely collide; a collision that happens later shows as a bind error.
    """
    pick = rng or random.Random()  # noqa: S311 - spreading test environments, not security
    for _ in range(attempts):
        prefix = f"127.{pick.randint(1, 254)}.{pick.randint(0, 255)}."
        with contextlib.suppress(OSError):
            if all(free(f"{prefix}{o}", p) for o in last_octets for p in ports):
                return prefix
    raise NoFreeLoopbackBlockError(
        f"no 127.A.B.0/24 block with ports {list(ports)} free on {len(last_octets)} addresses after "
        f"{attempts} tries; stop other simulators or pass explicit addresses")
