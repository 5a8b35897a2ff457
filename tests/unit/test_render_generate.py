"""Generator inputs the stability files do not cover: CNI presets, hostname, mirrors, aescbc, keys."""

from __future__ import annotations

import base64
import binascii
import dataclasses
from typing import Any

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.render.config import MachineConfig
from ichord.render.errors import RenderError
from ichord.render.generate import generate, render
from ichord.render.inputs import ClusterInputs, MachineInputs


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle(VersionContract(1, 6))


def inputs(contract: VersionContract, **kw: Any) -> ClusterInputs:
    return ClusterInputs(cluster_name="c", endpoint="https://c.example:6443", kubernetes_version="1.34.1",
                         contract=contract, **kw)


@pytest.mark.parametrize("preset", ["cilium", "unmanaged"])
def test_cni_none_presets(bundle: SecretsBundle, preset: str) -> None:
    for role in ("controlplane", "worker"):
        legacy = render(bundle, inputs(V1_13, cni_preset=preset), MachineInputs(role=role))
        assert legacy.v1alpha1["cluster"]["network"]["cni"] == {"name": "none"}
    multidoc = render(bundle, inputs(V1_14, cni_preset=preset), MachineInputs())
    assert multidoc.find("KubeFlannelCNIConfig") is None
    assert multidoc.find("KubeExternalManifestConfig") is None
    assert render(bundle, inputs(V1_14), MachineInputs()).find("KubeFlannelCNIConfig") is not None


def test_several_custom_cni_urls(bundle: SecretsBundle) -> None:
    urls = ("https://a.example/cni.yaml", "https://b.example/cni.yaml")
    legacy = render(bundle, inputs(V1_13, cni_urls=urls), MachineInputs())
    assert legacy.v1alpha1["cluster"]["network"]["cni"] == {"name": "custom", "urls": list(urls)}
    multidoc = render(bundle, inputs(V1_14, cni_urls=urls), MachineInputs())
    manifests = [(d["name"], d["url"]) for d in multidoc.find_all("KubeExternalManifestConfig")]
    assert manifests == [("custom-cni", urls[0]), ("custom-cni-2", urls[1])]
    assert multidoc.find("KubeFlannelCNIConfig") is None


@pytest.mark.parametrize("contract", [V1_13, V1_14], ids=str)
def test_hostname_and_registry_mirrors(bundle: SecretsBundle, contract: VersionContract) -> None:
    mirrors = {"quay.io": ("https://q.example",), "docker.io": ("https://d1.example", "http://d2.example")}
    cfg = render(bundle, inputs(contract, registry_mirrors=mirrors), MachineInputs(hostname="node-1"))
    hostname = cfg.find("HostnameConfig")
    assert hostname is not None and dict(hostname) == {
        "apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "off", "hostname": "node-1"}
    docs = [(d["name"], [e["url"] for e in d["endpoints"]]) for d in cfg.find_all("RegistryMirrorConfig")]
    assert docs == [("docker.io", ["https://d1.example", "http://d2.example"]), ("quay.io", ["https://q.example"])]


def test_aescbc_bundles(bundle: SecretsBundle) -> None:
    old = dataclasses.replace(bundle, secretbox_encryption_secret=None, aescbc_encryption_secret="YWVzY2Jj")
    legacy = render(old, inputs(V1_13), MachineInputs()).v1alpha1["cluster"]
    assert legacy["aescbcEncryptionSecret"] == "YWVzY2Jj" and "secretboxEncryptionSecret" not in legacy
    enc = render(old, inputs(V1_14), MachineInputs()).find("KubeEtcdEncryptionConfig")
    assert enc is not None
    providers = enc["config"]["resources"][0]["providers"]
    assert providers == [{"aescbc": {"keys": [{"name": "key1", "secret": "YWVzY2Jj"}]}}]


def test_local_api_server_port_is_control_plane_only(bundle: SecretsBundle) -> None:
    cp = render(bundle, inputs(V1_13, local_api_server_port=5443), MachineInputs())
    worker = render(bundle, inputs(V1_13, local_api_server_port=5443), MachineInputs(role="worker"))
    assert cp.v1alpha1["cluster"]["controlPlane"]["localAPIServerPort"] == 5443
    assert "localAPIServerPort" not in worker.v1alpha1["cluster"]["controlPlane"]


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def _holds_private_key(cfg: MachineConfig) -> bool:
    for s in _strings(cfg.plain()):
        if "PRIVATE KEY" in s:
            return True
        try:
            if b"PRIVATE KEY" in base64.b64decode(s, validate=True):
                return True
        except (binascii.Error, ValueError):
            continue
    return False


@pytest.mark.parametrize("contract", [V1_13, V1_14], ids=str)
def test_workers_never_hold_a_private_key(bundle: SecretsBundle, contract: VersionContract) -> None:
    assert not _holds_private_key(render(bundle, inputs(contract), MachineInputs(role="worker")))
    assert _holds_private_key(render(bundle, inputs(contract), MachineInputs()))  # the check can fail


def test_unsupported_contract_is_refused(bundle: SecretsBundle) -> None:
    with pytest.raises(RenderError, match=r"contract v1\.12"):
        generate(bundle, inputs(VersionContract(1, 12)), MachineInputs())


def test_reprs_hold_no_secrets(bundle: SecretsBundle) -> None:
    secret_patch = "machine:\n  registries:\n    config:\n      r.example:\n        auth: {password: hunter2}\n"
    cluster = inputs(V1_14, patches=(secret_patch,))
    cfg = render(bundle, cluster, MachineInputs(patches=(secret_patch,)))
    for text in (repr(cfg), repr(cluster), repr(MachineInputs(patches=(secret_patch,)))):
        assert "hunter2" not in text
        assert bundle.trustd_token not in text and "PRIVATE KEY" not in text
    assert "KubeAPIServerCAConfig" in repr(cfg)
