"""The client factory's trust hook and bounds: in-cluster ca.crt re-read per request, host name checking
kept on, insecure kubeconfigs refused, the request timeout on generated API calls, bearer tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ichord import yamlio
from ichord.kube import errors
from ichord.kube.client import from_kubeconfig, in_cluster
from ichord.kube.reads import read_config_map
from ichord.metrics import REGISTRY
from ichord.pki.ca import CAKind, generate_ca
from ichord.settings import Timing
from ichord.sim.kube import KubeSimulator, SimSettings

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def service_account(tmp_path: Path, ca_pem: bytes, token: str) -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_bytes(ca_pem)
    (sa / "namespace").write_text("ichord-system\n")
    return sa


async def test_in_cluster_client_follows_the_refreshed_ca_file(tmp_path: Path) -> None:
    async with KubeSimulator(SimSettings(token="sa-token")) as sim:
        sa = service_account(tmp_path, sim.ca_pem, "sa-token")
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(sim.port)}
        kube = in_cluster(service_account=sa, environ=env)
        try:
            assert kube.namespace == "ichord-system"
            assert (await read_config_map(kube, "default", "kube-root-ca.crt"))["data"]
            new_ca = generate_ca(CAKind.KUBERNETES)
            await sim.switch_serving_ca(new_ca)
            with pytest.raises(errors.TLSVerificationError):
                await read_config_map(kube, "default", "kube-root-ca.crt")
            (sa / "ca.crt").write_bytes(new_ca.cert_pem)  # the kubelet refreshes the projected file
            assert (await read_config_map(kube, "default", "kube-root-ca.crt"))["data"]
        finally:
            await kube.close()
        (sa / "token").write_text("wrong")
        other = in_cluster(service_account=sa, environ=env)
        try:
            with pytest.raises(errors.Unauthorized):
                await read_config_map(other, "default", "kube-root-ca.crt")
        finally:
            await other.close()
    with pytest.raises(errors.KubeError, match="in-cluster"):
        in_cluster(service_account=sa, environ={})


async def test_host_name_is_still_checked(tmp_path: Path) -> None:
    # The CA is trusted but the certificate names another address: verification must fail.
    async with KubeSimulator(SimSettings(serving_hosts=("10.9.9.9",))) as sim:
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"))
        try:
            with pytest.raises(errors.TLSVerificationError):
                await read_config_map(kube, "default", "kube-root-ca.crt")
        finally:
            await kube.close()


async def test_insecure_kubeconfig_is_refused(tmp_path: Path) -> None:
    async with KubeSimulator() as sim:
        path = sim.write_kubeconfig(tmp_path / "kc")
        cfg = yamlio.load(path.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        del cluster["certificate-authority-data"]
        cluster["insecure-skip-tls-verify"] = True  # negative: the client must refuse it
        path.write_text(yamlio.dump(cfg))
        with pytest.raises(errors.KubeError, match="refuses"):
            await from_kubeconfig(path)


async def test_generated_api_calls_are_bounded_and_measured(tmp_path: Path) -> None:
    def samples() -> float:
        return REGISTRY.get_sample_value("ichord_kube_request_duration_seconds_count",
                                         {"verb": "GET", "code": "200"}) or 0.0
    async with KubeSimulator() as sim:
        timing = dataclasses.replace(Timing(), kube_request_timeout=0.3)
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kc"), timing=timing)
        try:
            before = samples()
            await kube.core().read_namespaced_config_map("kube-root-ca.crt", "default")
            assert samples() == before + 1
            sim.faults.latency = 0.6
            with pytest.raises(errors.KubeTimeout), errors.translate():
                await kube.core().read_namespaced_config_map("kube-root-ca.crt", "default")
        finally:
            await kube.close()


async def test_a_ca_trusted_twice_is_one_trust_set_so_the_context_and_its_connections_stay(tmp_path: Path) -> None:
    """ca.crt and the trust pool's extras hold the same CA once the kubelet refreshed ca.crt after a rotation; the
    pool's clear then changes nothing trusted, and must not cost a new context (a new TLS connection)."""
    async with KubeSimulator(SimSettings(token="t")) as sim:
        trust = [sim.ca_pem]
        kube = await from_kubeconfig(sim.write_kubeconfig(tmp_path / "kubeconfig", token="t"),
                                     trust=lambda: list(trust))
        try:
            session = kube.api.rest_client.pool_manager
            assert (await read_config_map(kube, "default", "kube-root-ca.crt"))["data"]
            first = session.ssl_context()
            trust.append(sim.ca_pem)  # an extra that ca.crt holds too
            assert session.ssl_context() is first
            trust.pop()  # the pool cleared
            assert session.ssl_context() is first
            trust.append(generate_ca(CAKind.KUBERNETES).cert_pem)  # another CA: another trust set
            assert session.ssl_context() is not first
            assert (await read_config_map(kube, "default", "kube-root-ca.crt"))["data"]
        finally:
            await kube.close()
