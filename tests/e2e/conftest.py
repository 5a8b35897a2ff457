"""End-to-end fixtures: a whole simulated cluster (`ichord sim`'s environment) per test.

``sim_env`` is the default 3 control planes + 1 worker, self-hosted API, delays scaled down;
``make_sim_env`` starts others (more machines, ``management_api="separate"``, v1.13, ...). Each
environment takes its own random 127.A.B.0/24 block, so tests can run side by side.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.sim.combined import SimEnvironment

#: Simulated delays x0.05: a reboot takes 100 ms, a kubelet restart 50 ms, an API server restart 250 ms.
E2E_TIME_SCALE = 0.05

MakeSimEnv = Callable[..., Awaitable[SimEnvironment]]


@pytest.fixture(scope="session")
def e2e_bundle() -> SecretsBundle:
    """One bundle for the session: generating one costs ~0.7 s, an environment ~0.3 s."""
    return generate_bundle()


@pytest.fixture
async def make_sim_env(e2e_bundle: SecretsBundle) -> AsyncIterator[MakeSimEnv]:
    """``await make_sim_env(**SimEnvironment options)``: started now, stopped after the test."""
    async with AsyncExitStack() as stack:
        async def make(**options: Any) -> SimEnvironment:
            options.setdefault("bundle", e2e_bundle)
            options.setdefault("time_scale", E2E_TIME_SCALE)
            return await stack.enter_async_context(SimEnvironment(**options))
        yield make


@pytest.fixture
async def sim_env(make_sim_env: MakeSimEnv) -> SimEnvironment:
    """3 control planes + 1 worker, v1.14, ichord's objects on the managed cluster's own API."""
    return await make_sim_env()
