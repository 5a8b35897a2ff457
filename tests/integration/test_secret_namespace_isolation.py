"""Issue 14: a TalosCluster reads a bundle Secret of its own namespace only, unless the administrator allows
another (cert-manager's Issuer rule). Without that, whoever may create a TalosCluster anywhere could make ichord
read, and rotate with, another cluster's CA keys. Driven through the real cluster actor step over the real
wire; the simulator's request log proves nothing was read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.cluster_cli import bundle_export
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._actor import cluster_actor

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TIMING = replace(Timing().scaled(0.01))
TEAM_A = "team-a"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture
async def env(bundle: SecretsBundle) -> AsyncIterator[SimEnvironment]:
    async with SimEnvironment(bundle=bundle, time_scale=0.01, control_planes=1, workers=0) as e:
        yield e


async def _step(kube: KubeClient, env: SimEnvironment, allowed: frozenset[str]) -> None:
    """One step of the actor of TalosCluster team-a/remote, as the leader would run it."""
    async with cluster_actor(kube, env.namespace, TEAM_A, "remote", TIMING,
                             allowed_secret_namespaces=allowed) as reconciler:
        await reconciler.step({})


def _secret_reads(env: SimEnvironment) -> list[Any]:
    return [e for e in env.management.requests.entries
            if e.verb == "get" and e.path == f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}"]


async def test_a_cluster_naming_another_namespaces_secret_is_refused_unless_allowed(env: SimEnvironment,
                                                                                   tmp_path: Path) -> None:
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": TEAM_A}})
        home = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        # A TalosCluster in team-a pointing at the bundle of the cluster in the controller namespace.
        await crds.clusters(kube).create(TEAM_A, {"metadata": {"name": "remote"}, "spec": {
            **home["spec"], "secretsRef": {"name": env.secret_name, "namespace": env.namespace}}})
        env.management.requests.clear()

        await _step(kube, env, frozenset())
        remote = await crds.clusters(kube).get(TEAM_A, "remote")
        ready = find(remote["status"]["conditions"], names.READY)
        assert ready is not None and (ready["status"], ready["reason"]) == ("False", "CrossNamespaceRefused")
        assert f"{env.namespace}/{env.secret_name}" in ready["message"]
        assert "--allow-secret-namespace" in ready["message"]
        assert _secret_reads(env) == []  # nothing was read: not even a GET of the other namespace's Secret
        assert "certificates" not in remote["status"]
        events = (await kube.raw("GET", f"/api/v1/namespaces/{TEAM_A}/events"))["items"]
        assert [e["type"] for e in events if e["reason"] == "CrossNamespaceRefused"] == ["Warning"]

        # The administrator allows the namespace: the bundle is read and expiry published. The cluster that held the
        # Secret is gone first: two clusters on one bundle are refused (docs/decisions.md#one-owner).
        await crds.clusters(kube).delete(env.namespace, env.cluster_name)
        await _step(kube, env, frozenset({env.namespace}))
        remote = await crds.clusters(kube).get(TEAM_A, "remote")
        assert find(remote["status"]["conditions"], names.READY)["status"] == "True"
        assert [c["name"] for c in remote["status"]["certificates"]] == [
            "talos", "kubernetes", "kubernetes-aggregator", "etcd"]
        assert _secret_reads(env)
        # The operator's commands find the Secret where the daemon does (spec.secretsRef.namespace), unasked.
        report = await bundle_export(kube, "remote", namespace=TEAM_A, output=tmp_path / "secrets.yaml")
        assert (tmp_path / "secrets.yaml").read_bytes() and report.fingerprint


async def test_a_cluster_reads_the_secret_of_its_own_namespace_by_default(env: SimEnvironment) -> None:
    """The same name in the cluster's own namespace is what a secretsRef without namespace means."""
    async with await from_kubeconfig(env.kubeconfig, timing=TIMING) as kube:
        await kube.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": TEAM_A}})
        secret = await kube.raw("GET", f"/api/v1/namespaces/{env.namespace}/secrets/{env.secret_name}")
        await kube.raw("POST", f"/api/v1/namespaces/{TEAM_A}/secrets", body={
            "metadata": {"name": env.secret_name}, "type": "Opaque", "data": secret["data"]})
        home = await crds.clusters(kube).get(env.namespace, env.cluster_name)
        await crds.clusters(kube).create(TEAM_A, {"metadata": {"name": "remote"}, "spec": {
            **home["spec"], "secretsRef": {"name": env.secret_name}}})
        env.management.requests.clear()
        await _step(kube, env, frozenset())
        remote = await crds.clusters(kube).get(TEAM_A, "remote")
        assert find(remote["status"]["conditions"], names.READY)["status"] == "True"
        assert _secret_reads(env) == []  # its own namespace's Secret, not the controller namespace's
        labelled = await kube.raw("GET", f"/api/v1/namespaces/{TEAM_A}/secrets/{env.secret_name}")
        assert labelled["metadata"]["labels"][names.BUNDLE_LABEL] == "true"
