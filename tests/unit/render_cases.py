"""Render inputs shared by the render tests: the stability inputs of ../shared/reference/talos/README.md."""

from __future__ import annotations

from pathlib import Path

from ichord.contract import V1_14, VersionContract
from ichord.render.inputs import ClusterInputs

BASE = {"cluster_name": "base", "endpoint": "https://base:6443", "kubernetes_version": "1.28.0"}
OVERRIDES = {
    "additional_sans": ("foo", "bar"),
    "allow_scheduling_on_control_planes": True,
    "dns_domain": "example.com",
    "install_disk": "/dev/vda",
    "install_extra_kernel_args": ("foo=bar", "bar=baz"),
    "local_api_server_port": 5443,
    "sysctls": {"foo": "bar"},
    "cni_urls": ("https://example.com/cni.yaml",),
    "registry_mirrors": {"ghcr.io": ("https://ghcr.io.my-mirror.com",)},
}


def stability_patch(samples: Path, contract: VersionContract) -> str:
    name = "patch.yaml" if contract >= V1_14 else "patch-pre14.yaml"
    return (samples / "stability" / name).read_text()


def stability_inputs(contract: VersionContract, variant: str, samples: Path | None = None) -> ClusterInputs:
    """``base`` or ``overrides`` inputs; overrides add the stability patch when ``samples`` is given."""
    kwargs: dict[str, object] = {**BASE, "contract": contract}
    if variant == "overrides":
        kwargs.update(OVERRIDES)
        if samples is not None:
            kwargs["patches"] = (stability_patch(samples, contract),)
    return ClusterInputs(**kwargs)  # type: ignore[arg-type]
