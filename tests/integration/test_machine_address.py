"""Issue 39: a TalosMachine whose spec.address cannot be dialled (the CRD does not require one, nor check its form)
says so, and its cluster's other machines are served: it used to crash the cluster actor's whole step (a ValueError
or an OverflowError from the socket layer), which its supervisor restarted with backoff, for ever."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.kube import crds
from ichord.kube.client import from_kubeconfig
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._kube_helpers import eventually

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))


@pytest.mark.parametrize(("address", "said"), [
    (None, "the address is empty"),
    ("127.0.0.1:abc", "is not a number"),
    ("127.0.0.1:99999", "outside 1-65535"),
    ("https://127.0.0.1", "no scheme, path or spaces"),
    ("[fd00::1", "opens a bracket"),
])
async def test_an_address_that_cannot_be_dialled_is_said_and_stops_nothing_else(env: SimEnvironment,
                                                                                address: str | None,
                                                                                said: str) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube, \
            cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, TIMING) as actor:
        spec = {"clusterRef": {"name": env.cluster_name}, "role": "worker", "approved": True,
                **({"address": address} if address is not None else {})}
        await crds.machines(kube).create(env.namespace, {"metadata": {"name": "zz-bad"}, "spec": spec})
        await eventually(lambda: actor.rt.machines.cache.get((env.namespace, "zz-bad")) is not None)
        await actor.step({})  # no exception: the step went on past the machine

        bad = find((await crds.machines(kube).get(env.namespace, "zz-bad"))["status"]["conditions"], names.READY)
        assert (bad["status"], bad["reason"]) == ("False", names.ReadyReason.INVALID_ADDRESS), bad["message"]
        assert said in bad["message"] and "kubectl -n" in bad["message"]
        for name in env.machine_names:
            ready = find((await crds.machines(kube).get(env.namespace, name))["status"]["conditions"], names.READY)
            assert ready["reason"] == names.ReadyReason.CONVERGED
        events = (await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/events"))["items"]
        assert [e["type"] for e in events if e["involvedObject"]["name"] == "zz-bad"] == ["Warning"]
