"""Issue 26, "intent is immutable once started", where no admission policy guards it (the API simulator, like a
kube-apiserver without the chart's ValidatingAdmissionPolicy): a ``spec.caRotation.targets`` patch on a running
rotation is accepted by the API, and ichord keeps the targets it started with, says so (condition
SpecChangeIgnored naming the field, one Warning Event) and ``ichord cluster status`` shows it. The real
kube-apiserver with the chart's policy refuses the same patch (tests/real/test_operation_intent_real.py).

The simulator implements no admission policy (it serves no admissionregistration.k8s.io): a policy sent to it is
refused (404), never stored and silently not enforced."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import anyio
import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.cluster_status import format_status, read_view
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import NotFound
from ichord.operations.ca_rotation.plan import handoff_token
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor
from tests.integration._ca_rotation_driver import TIMING

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
OP = "rotate-talos"
STEP_TIMING = replace(TIMING, ca_pass_wait_bound=60.0)


def _events(env: SimEnvironment, reason: str) -> list[Obj]:
    store = env.management.store
    return [e for e in store.list(store.resolve("", "v1", "events"), env.namespace)[0]
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == OP]


async def _acknowledge(kube: KubeClient, env: SimEnvironment, op: Obj) -> None:
    """The operator's hand-off (what `ichord cluster credentials --acknowledge` ends with)."""
    token = handoff_token(op["status"]["caRotation"]["certificates"])
    if (op["metadata"].get("annotations") or {}).get(names.CREDENTIALS_HANDOFF_ANNOTATION) != token:
        await crds.operations(kube).patch(env.namespace, OP, {"metadata": {"annotations": {
            names.CREDENTIALS_HANDOFF_ANNOTATION: token}}})


async def test_a_targets_patch_on_a_running_rotation_is_ignored_and_reported(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=STEP_TIMING) as kube:
        ops = crds.operations(kube)
        await ops.create(env.namespace, {"metadata": {"name": OP}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": ["talos"]}}})
        etcd_ca = {n: env.node(n).view.etcd_ca.cert_pem for n in env.machine_names if env.node(n).view.etcd_ca}
        boots = {n: env.node(n).boots for n in env.machine_names}
        patched = False
        seen_ignored: list[Obj] = []
        status_text = ""
        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, STEP_TIMING) as reconciler:
            with anyio.fail_after(120):
                while True:
                    await reconciler.step({})
                    op = await ops.get(env.namespace, OP)
                    status = op.get("status") or {}
                    stage = (status.get("caRotation") or {}).get("stage")
                    if status.get("phase") in ("Completed", "Failed"):
                        break
                    if stage and not patched:
                        # Running (it left Pending): the API takes the patch, as kube-apiserver without the policy.
                        assert status["acceptedSpec"] == {"clusterRef": {"name": env.cluster_name},
                                                          "kind": "ca-rotation", "caRotation": {"targets": ["talos"]}}
                        await ops.patch(env.namespace, OP, {"spec": {"caRotation": {
                            "targets": ["talos", "kubernetes", "etcd"]}}})
                        patched = True
                    cond = find(status.get("conditions"), names.SPEC_CHANGE_IGNORED)
                    if cond is not None and cond["status"] == "True":
                        seen_ignored.append(cond)
                        if not status_text:
                            status_text = format_status(await read_view(kube, env.namespace, env.cluster_name),
                                                        dt.datetime.now(dt.UTC))
                    if stage == "AwaitingCredentials":
                        await _acknowledge(kube, env, op)
                    await anyio.sleep(0.02)
        await reconciler.rt.recorder.drain()
        op = await ops.get(env.namespace, OP)

    assert patched
    assert op["status"]["phase"] == "Completed", op["status"]
    # It ran with the targets it accepted: the etcd CA never changed, no node rebooted (the etcd roll never ran).
    assert op["status"]["caRotation"]["targets"] == ["talos"]
    assert op["status"]["plan"]["targets"] == ["talos"]
    assert {n: env.node(n).view.etcd_ca.cert_pem for n in etcd_ca} == etcd_ca
    assert {n: env.node(n).boots for n in env.machine_names} == boots
    # Reported: the condition names the field, one Warning, and `cluster status` shows it.
    assert seen_ignored, "SpecChangeIgnored was never raised"
    assert seen_ignored[0]["reason"] == names.SpecChangeReason.IGNORED
    assert "spec.caRotation.targets" in seen_ignored[0]["message"]
    warnings = _events(env, names.EventReason.SPEC_CHANGE_IGNORED)
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning", warnings
    assert sum(int(w.get("count") or 1) for w in warnings) == 1
    assert "spec change ignored: spec.caRotation.targets changed after the operation started" in status_text


async def test_putting_the_spec_back_lowers_the_condition(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=STEP_TIMING) as kube:
        ops = crds.operations(kube)
        await ops.create(env.namespace, {"metadata": {"name": OP}, "spec": {
            "clusterRef": {"name": env.cluster_name}, "kind": "ca-rotation", "caRotation": {"targets": ["talos"]},
            "maxUnavailable": 1}})
        async with cluster_actor(kube, env.namespace, env.namespace, env.cluster_name, STEP_TIMING) as reconciler:
            with anyio.fail_after(60):
                while not ((await ops.get(env.namespace, OP)).get("status") or {}).get("acceptedSpec"):
                    await reconciler.step({})
                await ops.patch(env.namespace, OP, {"spec": {"maxUnavailable": "50%"}})
                while (find((await ops.get(env.namespace, OP))["status"].get("conditions"),
                            names.SPEC_CHANGE_IGNORED) or {}).get("status") != "True":
                    await reconciler.step({})
                cond = find((await ops.get(env.namespace, OP))["status"]["conditions"], names.SPEC_CHANGE_IGNORED)
                assert "spec.maxUnavailable" in cond["message"] and "caRotation" not in cond["message"]
                await ops.patch(env.namespace, OP, {"spec": {"maxUnavailable": 1}})
                while (find((await ops.get(env.namespace, OP))["status"].get("conditions"),
                            names.SPEC_CHANGE_IGNORED) or {}).get("status") != "False":
                    await reconciler.step({})
            await reconciler.rt.recorder.drain()
        assert len(_events(env, names.EventReason.SPEC_CHANGE_IGNORED)) == 1


async def test_the_simulator_refuses_an_admission_policy_rather_than_store_it_unenforced(env: SimEnvironment) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=STEP_TIMING) as kube:
        with pytest.raises(NotFound):
            await kube.raw("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
                           body={"apiVersion": "admissionregistration.k8s.io/v1",
                                 "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "x"}, "spec": {}})
