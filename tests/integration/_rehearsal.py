"""Shared by the rehearsal's tests: the command run in-process (``cli``), and what a rehearsal did to the live
simulators (``Writes``: every request it made that is not a read).

The rehearsal reads the live management API with its own token (``REHEARSAL_USER``) and the managed API with the
client certificate a node's Kubeconfig issues; the live world's own informers use the environment's token, so
neither is mistaken for the other. On the nodes, the calls a rehearsal may make are reads (``READ_RPCS``).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from ichord.cli import main
from ichord.sim.combined import SimEnvironment

READ_VERBS = frozenset({"get", "list", "watch"})
#: The Talos calls a rehearsal may make: reads (Kubeconfig signs a client certificate in memory, changes nothing).
READ_RPCS = frozenset({"Version", "Get", "EtcdMemberList", "Kubeconfig"})
REHEARSAL_USER, REHEARSAL_TOKEN = "rehearsal", "rehearsal-token-0123456789"


class Writes:
    """Every request the live simulators served the rehearsal (its own user on the live API) that is not a read."""

    def __init__(self, env: SimEnvironment, tmp: Path) -> None:
        self.env = env
        env.management.add_user(REHEARSAL_TOKEN, REHEARSAL_USER)
        self.kubeconfig = env.management.write_kubeconfig(tmp / "rehearsal", namespace=env.namespace,
                                                          token=REHEARSAL_TOKEN)
        self.rpcs = {name: Counter(node.rpcs) for name, node in env.talos.nodes.items()}
        self.since = len(env.kube.requests.access)

    def kube(self) -> list[tuple[str, str, str]]:
        """Writes by the rehearsal's token (the management API) and by any client certificate (the managed API,
        through the admin kubeconfig a node issues): the live world's own informers use the environment's token."""
        mine = self.env.management.requests.by_user(REHEARSAL_USER)
        assert mine  # it did read the management API
        entries = self.env.kube.requests.access[self.since:]
        managed = [a for a in entries if a.user not in (REHEARSAL_USER, self.env.kube.settings.token_user)]
        assert any(a.resource == "poddisruptionbudgets" for a in managed)  # it did read the managed API
        return [(a.user, a.verb, a.resource) for a in [*mine, *managed] if a.verb not in READ_VERBS]

    def talos(self) -> dict[str, Counter[str]]:
        out = {}
        for name, node in self.env.talos.nodes.items():
            new = Counter(node.rpcs)
            new.subtract(self.rpcs[name])
            out[name] = +new
        return out

    def assert_none(self) -> None:
        assert self.kube() == []
        calls = self.talos()
        assert all(set(c) <= READ_RPCS for c in calls.values()), calls
        assert any(calls.values())  # it did read the nodes


def cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """The command configures logging for its process; the test process gets its own back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
