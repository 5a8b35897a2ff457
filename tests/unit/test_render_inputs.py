"""TalosCluster / TalosMachine specs -> render inputs, and the typed errors naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import generate_bundle
from ichord.render.errors import RenderInputError
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs

SPEC: dict[str, Any] = {"secretsRef": {"name": "s"}, "endpoint": "https://c.example:6443",
                        "kubernetesVersion": "1.34.1"}


def test_minimal_spec_takes_talos_defaults() -> None:
    c = ClusterInputs.from_spec("prod", SPEC)
    assert (c.cluster_name, c.endpoint, c.kubernetes_version, c.contract) == (
        "prod", "https://c.example:6443", "1.34.1", V1_14)
    assert (c.dns_domain, c.local_api_server_port, c.cni_preset, c.cni_custom) == (
        "cluster.local", 6443, "flannel", False)
    assert c.patches == () and c.sysctls == {} and c.registry_mirrors == {}


def test_full_spec() -> None:
    spec = {
        **SPEC, "clusterName": "other", "kubernetesVersion": "v1.33.0", "talosVersion": "v1.13.2",
        "install": {"disk": "/dev/sda", "extraKernelArgs": ["a=b"]}, "additionalSANs": ["x.example"],
        "dnsDomain": "k.local", "allowSchedulingOnControlPlanes": True, "localAPIServerPort": 7443,
        "sysctls": {"net.core.somaxconn": 65535}, "registryMirrors": {"docker.io": ["https://m.example"]},
        "cni": {"urls": ["https://example.com/cni.yaml"]},
        "patches": ["machine:\n  network:\n    hostname: a\n", {"machine": {"certSANs": ["b"]}},
                    [{"op": "add", "path": "/machine/env", "value": {"A": "1"}}]],
    }
    c = ClusterInputs.from_spec("ignored", spec)
    assert c.cluster_name == "other" and c.kubernetes_version == "1.33.0" and c.contract == V1_13
    assert c.install_disk == "/dev/sda" and c.install_extra_kernel_args == ("a=b",)
    assert c.sysctls == {"net.core.somaxconn": "65535"}
    assert c.registry_mirrors == {"docker.io": ("https://m.example",)}
    assert c.cni_custom and c.cni_urls == ("https://example.com/cni.yaml",)
    assert len(c.patches) == 3
    # Inline mapping / list patches are dumped to text and apply like text ones.
    cfg = render(generate_bundle(VersionContract(1, 6)), c, MachineInputs())
    machine = cfg.v1alpha1["machine"]
    assert machine["network"]["hostname"] == "a" and "b" in machine["certSANs"] and machine["env"] == {"A": "1"}


@pytest.mark.parametrize(("change", "field"), [
    ({"endpoint": None}, "spec.endpoint"),
    ({"endpoint": "http://c:6443"}, "spec.endpoint"),
    ({"endpoint": "https://c:99999"}, "spec.endpoint"),
    ({"kubernetesVersion": "latest"}, "spec.kubernetesVersion"),
    ({"talosVersion": "v1.12"}, "spec.talosVersion"),
    ({"clusterName": "Bad Name"}, "spec.clusterName"),
    ({"install": {"disk": "sda"}}, "spec.install.disk"),
    ({"install": {"disk": '/dev/sd"a'}}, "spec.install.disk"),
    ({"install": {"extraKernelArgs": "a=b"}}, "spec.install.extraKernelArgs"),
    ({"additionalSANs": [1]}, "spec.additionalSANs"),
    ({"dnsDomain": "not a domain"}, "spec.dnsDomain"),
    ({"allowSchedulingOnControlPlanes": "yes"}, "spec.allowSchedulingOnControlPlanes"),
    ({"localAPIServerPort": 0}, "spec.localAPIServerPort"),
    ({"sysctls": {"a": {"b": 1}}}, "spec.sysctls.a"),
    ({"registryMirrors": {"docker.io": []}}, "spec.registryMirrors.docker.io"),
    ({"registryMirrors": {"docker.io": ["ftp://x"]}}, "spec.registryMirrors.docker.io[0].url"),
    ({"cni": {"preset": "calico"}}, "spec.cni.preset"),
    ({"cni": {"preset": "cilium", "urls": ["https://x/cni.yaml"]}}, "spec.cni"),
    ({"patches": "machine: {}"}, "spec.patches"),
    ({"patches": [""]}, "spec.patches[0]"),
])
def test_bad_cluster_specs_name_the_field(change: dict[str, Any], field: str) -> None:
    spec = {**SPEC, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(RenderInputError) as info:
        ClusterInputs.from_spec("c", spec)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_machine_spec() -> None:
    m = MachineInputs.from_spec({"clusterRef": {"name": "c"}, "role": "worker", "hostname": "w-1",
                                 "address": "10.0.0.1", "approved": True, "patches": ["machine: {}\n"]})
    assert (m.role, m.hostname, m.patches, m.controlplane) == ("worker", "w-1", ("machine: {}\n",), False)
    for bad, field in (({"role": "master"}, "spec.role"), ({}, "spec.role"),
                       ({"role": "worker", "hostname": "Not_Valid"}, "spec.hostname")):
        with pytest.raises(RenderInputError) as info:
            MachineInputs.from_spec(bad)
        assert info.value.field == field
