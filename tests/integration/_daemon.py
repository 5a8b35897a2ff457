"""The whole ichord daemon in the test's own process (leader election, informers, the router, the supervisor and
each cluster's mailbox actor) against a simulator environment: what issue 29's fake kind and fake CA target run
under, with nothing stepping the actor but the daemon itself."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio

from ichord.daemon import Daemon, DaemonSettings
from ichord.kube.client import KubeClient
from ichord.operations.registry import Registry
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment

T = TypeVar("T")


@asynccontextmanager
async def running_daemon(env: SimEnvironment, kube: KubeClient, timing: Timing, *, identity: str,
                         registry: Registry | None = None) -> AsyncIterator[Daemon]:
    """The daemon running until the block ends (then cancelled). ``registry``: the operations it runs instead of
    ichord's default (Daemon builds its Runtime with the default; the Runtime takes any, its field)."""
    settings = DaemonSettings(kubeconfig=str(env.kubeconfig), namespace=env.namespace, identity=identity,
                              metrics_host="127.0.0.1", metrics_port=0, timing=timing, trust_pool=False)
    daemon = Daemon(settings, kube)
    if registry is not None:
        daemon.runtime = dataclasses.replace(daemon.runtime, registry=registry)
    async with anyio.create_task_group() as tg:
        tg.start_soon(daemon.run)
        try:
            yield daemon
        finally:
            tg.cancel_scope.cancel()


async def wait_until(read: Callable[[], Awaitable[T]], done: Callable[[T], bool], *, within: float = 60,
                     interval: float = 0.05) -> T:
    """``read()`` again until ``done`` holds of what it returns, for at most ``within`` seconds (a bound on a hang,
    not a timing the test asserts): the daemon works on its own; the test only looks."""
    with anyio.fail_after(within):
        while True:
            value = await read()
            if done(value):
                return value
            await anyio.sleep(interval)
