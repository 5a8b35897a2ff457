"""The simulator's faults the hand-off retry must survive (docs/decisions.md#ca-rotation-passes), through the real
client and ichord's own retry classification: a webhook that timed out (500, configurable message) and a CRD
group not served yet for a while after kube-apiserver came back (404 without a name: "no matches for kind")."""

from __future__ import annotations

import pytest

from ichord.credentials.retry import Retrier, Verdict, classify
from ichord.kube import crds, errors
from ichord.kube.client import KubeClient
from ichord.sim.kube import KubeSimulator

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
NS = "default"
OP = {"metadata": {"name": "rotate"}, "spec": {"clusterRef": {"name": "demo"}, "kind": "ca-rotation",
                                               "paused": True}}


async def test_a_timed_out_webhook_is_a_500_the_retry_waits_out_and_a_denial_is_final(
        sim: KubeSimulator, kube: KubeClient) -> None:
    sim.faults.error_rate = {"create": 1.0}
    sim.faults.error_message = ('Internal error occurred: failed calling webhook "validate.example.com": failed to '
                                'call webhook: Post "https://webhook.example.svc:443/validate": context deadline '
                                'exceeded')
    with pytest.raises(errors.KubeError) as timed_out:
        await crds.operations(kube).create(NS, OP)
    assert timed_out.value.status == 500 and "failed calling webhook" in str(timed_out.value)
    assert classify(timed_out.value) is Verdict.TRANSIENT

    sim.faults.error_message = 'admission webhook "validate.example.com" denied the request: no'
    with pytest.raises(errors.KubeError) as denied:
        await crds.operations(kube).create(NS, OP)
    assert classify(denied.value) is Verdict.FINAL


async def test_a_crd_group_not_served_yet_after_a_restart_is_retried_until_it_is(
        sim: KubeSimulator, kube: KubeClient) -> None:
    await crds.operations(kube).create(NS, OP)
    sim.faults.discovery_lag = 0.5
    await sim.go_down()
    await sim.come_up()
    with pytest.raises(errors.NotFound) as missing:
        await crds.operations(kube).get(NS, "rotate")
    assert not (missing.value.details or {}).get("name")  # the resource type, not the object
    assert classify(missing.value) is Verdict.TRANSIENT
    await kube.raw("GET", f"/api/v1/namespaces/{NS}/configmaps")  # built-in groups are served meanwhile

    failures: list[str] = []
    told: list[str] = []

    async def read() -> dict[str, object]:
        try:
            return await crds.operations(kube).get(NS, "rotate")
        except errors.NotFound:
            failures.append("404")
            raise

    got = await Retrier(window=10.0, say=told.append, delays=(0.05, 0.1)).call("reading the operation", read)
    assert got["metadata"]["name"] == "rotate"
    assert failures and told  # it failed while the group was not served, and the operator was told it waits
