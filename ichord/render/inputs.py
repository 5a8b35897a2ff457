"""Render inputs: the TalosCluster / TalosMachine spec fields that `talosctl gen config` takes.

``ClusterInputs.from_spec`` / ``MachineInputs.from_spec`` validate a spec as the TalosCluster/TalosMachine CRDs define
it and raise RenderInputError naming the offending field, so a bad spec never reaches the generator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from ichord import yamlio
from ichord.contract import DEFAULT_CONTRACT, UnsupportedContractError, VersionContract, parse_contract
from ichord.render.errors import RenderInputError

Role = Literal["controlplane", "worker"]
CNIPreset = Literal["flannel", "cilium", "unmanaged"]

ROLES: tuple[Role, ...] = ("controlplane", "worker")
CNI_PRESETS: tuple[CNIPreset, ...] = ("flannel", "cilium", "unmanaged")
DEFAULT_API_SERVER_PORT = 6443

_K8S_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$")
# RFC 1123 label / subdomain: what Kubernetes and Talos accept for names and hostnames.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SYSCTL_KEY = re.compile(r"^[A-Za-z0-9_./-]+$")
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# Device paths only: the path is quoted into a CEL disk selector on v1.14, so no quotes or escapes.
_DEVICE_PATH = re.compile(r"^/dev/[A-Za-z0-9._:+/-]+$")


@dataclass(frozen=True)
class ClusterInputs:
    """Cluster-wide generate inputs (one TalosCluster)."""

    cluster_name: str
    endpoint: str
    kubernetes_version: str
    contract: VersionContract = DEFAULT_CONTRACT
    install_disk: str | None = None
    install_extra_kernel_args: tuple[str, ...] = ()
    additional_sans: tuple[str, ...] = ()
    dns_domain: str = "cluster.local"
    allow_scheduling_on_control_planes: bool = False
    local_api_server_port: int = DEFAULT_API_SERVER_PORT
    sysctls: Mapping[str, str] = field(default_factory=dict)
    registry_mirrors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    cni_preset: CNIPreset = "flannel"
    cni_urls: tuple[str, ...] = ()
    patches: tuple[str, ...] = field(default=(), repr=False)  # may hold credentials: never in a repr

    @property
    def cni_custom(self) -> bool:
        """Custom CNI manifests (Talos's ``cni.name: custom``) replace every preset."""
        return bool(self.cni_urls)

    @classmethod
    def from_spec(cls, name: str, spec: Mapping[str, Any]) -> ClusterInputs:
        """Inputs from a TalosCluster ``spec`` (``name`` is metadata.name, the default cluster name)."""
        if not isinstance(spec, Mapping):
            raise RenderInputError("spec", "is not a mapping", "give the TalosCluster spec as a YAML mapping")
        cluster_name = _str(spec, "clusterName", required=False) or name
        if not cluster_name:
            raise RenderInputError("spec.clusterName", "is missing and there is no metadata.name",
                                   "set spec.clusterName")
        if not _CLUSTER_NAME.match(cluster_name):
            raise RenderInputError("spec.clusterName", f"{cluster_name!r} is not a usable cluster name",
                                   "use letters, digits, '-', '_' and '.' without spaces")
        endpoint = _url(spec, "endpoint", schemes=("https",))
        k8s = _str(spec, "kubernetesVersion")
        m = _K8S_VERSION.match(k8s)
        if m is None:
            raise RenderInputError("spec.kubernetesVersion", f"{k8s!r} is not a Kubernetes version",
                                   "write it as 1.34.1")
        contract = DEFAULT_CONTRACT
        talos = spec.get("talosVersion")
        if talos is not None:
            try:
                contract = parse_contract(str(talos))
            except UnsupportedContractError as exc:
                raise RenderInputError("spec.talosVersion", str(exc), "set v1.13 or v1.14") from None
        install = _mapping(spec, "install")
        disk = _str(install, "disk", required=False, where="spec.install") or None
        if disk is not None and not _DEVICE_PATH.match(disk):
            raise RenderInputError("spec.install.disk", f"{disk!r} is not a device path",
                                   "give the install disk as /dev/<name> (e.g. /dev/disk/by-id/<id>)")
        return cls(
            cluster_name=cluster_name,
            endpoint=endpoint,
            kubernetes_version=m.group(1),
            contract=contract,
            install_disk=disk,
            install_extra_kernel_args=_str_list(install, "extraKernelArgs", where="spec.install"),
            additional_sans=_str_list(spec, "additionalSANs"),
            dns_domain=_dns_domain(spec),
            allow_scheduling_on_control_planes=_bool(spec, "allowSchedulingOnControlPlanes"),
            local_api_server_port=_port(spec, "localAPIServerPort"),
            sysctls=_sysctls(spec),
            registry_mirrors=_registry_mirrors(spec),
            **_cni(spec),
            patches=patches_from_spec(spec, "spec.patches"),
        )


@dataclass(frozen=True)
class MachineInputs:
    """Per-machine inputs (one TalosMachine)."""

    role: Role = "controlplane"
    hostname: str | None = None
    patches: tuple[str, ...] = field(default=(), repr=False)  # may hold credentials: never in a repr

    @property
    def controlplane(self) -> bool:
        return self.role == "controlplane"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> MachineInputs:
        if not isinstance(spec, Mapping):
            raise RenderInputError("spec", "is not a mapping", "give the TalosMachine spec as a YAML mapping")
        role = _str(spec, "role")
        if role not in ROLES:
            raise RenderInputError("spec.role", f"{role!r} is not a machine role", "use controlplane or worker")
        hostname = _str(spec, "hostname", required=False) or None
        if hostname is not None and (len(hostname) > 253 or not _DNS_SUBDOMAIN.match(hostname)):
            raise RenderInputError("spec.hostname", f"{hostname!r} is not a valid hostname",
                                   "use lower-case letters, digits, '-' and '.'")
        return cls(role="controlplane" if role == "controlplane" else "worker", hostname=hostname,
                   patches=patches_from_spec(spec, "spec.patches"))


# ---- field readers ------------------------------------------------------------------------


def _str(spec: Mapping[str, Any], key: str, *, required: bool = True, where: str = "spec") -> str:
    value = spec.get(key)
    if value is None or value == "":
        if required:
            raise RenderInputError(f"{where}.{key}", "is required", f"set {where}.{key}")
        return ""
    if not isinstance(value, str):
        raise RenderInputError(f"{where}.{key}", f"must be a string, not {type(value).__name__}",
                               "quote the value")
    return value.strip()


def _mapping(spec: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = spec.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RenderInputError(f"spec.{key}", "must be a mapping", f"see the CRD for the shape of {key}")
    return value


def _str_list(spec: Mapping[str, Any], key: str, *, where: str = "spec") -> tuple[str, ...]:
    value = spec.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RenderInputError(f"{where}.{key}", "must be a list of non-empty strings", "fix the list")
    return tuple(value)


def _bool(spec: Mapping[str, Any], key: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise RenderInputError(f"spec.{key}", "must be true or false", "write true or false unquoted")
    return value


def _port(spec: Mapping[str, Any], key: str) -> int:
    value = spec.get(key, DEFAULT_API_SERVER_PORT)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise RenderInputError(f"spec.{key}", f"{value!r} is not a TCP port", "use a number from 1 to 65535")
    return value


def _url(spec: Mapping[str, Any], key: str, *, schemes: tuple[str, ...], where: str = "spec") -> str:
    value = _str(spec, key, where=where)
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.hostname:
        allowed = " or ".join(f"{s}://" for s in schemes)
        raise RenderInputError(f"{where}.{key}", f"{value!r} is not an {allowed} URL with a host",
                               f"write it as {schemes[0]}://<host>:<port>")
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise RenderInputError(f"{where}.{key}", f"{value!r} has an invalid port", "fix the port") from None
    return value


def _dns_domain(spec: Mapping[str, Any]) -> str:
    domain = _str(spec, "dnsDomain", required=False) or "cluster.local"
    if not _DNS_SUBDOMAIN.match(domain):
        raise RenderInputError("spec.dnsDomain", f"{domain!r} is not a DNS domain", "use e.g. cluster.local")
    return domain


def _sysctls(spec: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in _mapping(spec, "sysctls").items():
        if not isinstance(key, str) or not _SYSCTL_KEY.match(key):
            raise RenderInputError("spec.sysctls", f"{key!r} is not a sysctl name", "use e.g. net.core.somaxconn")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise RenderInputError(f"spec.sysctls.{key}", "must be a string or number", "quote the value")
        out[key] = str(value)  # Talos's sysctls are map[string]string
    return out


def _registry_mirrors(spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for registry, endpoints in _mapping(spec, "registryMirrors").items():
        where = f"spec.registryMirrors.{registry}"
        if not isinstance(registry, str) or not registry:
            raise RenderInputError("spec.registryMirrors", "registry names must be strings", "fix the keys")
        if not isinstance(endpoints, list) or not endpoints:
            raise RenderInputError(where, "must be a non-empty list of endpoint URLs", "list the mirror URLs")
        urls = []
        for i, endpoint in enumerate(endpoints):
            urls.append(_url({"url": endpoint}, "url", schemes=("https", "http"), where=f"{where}[{i}]"))
        out[registry] = tuple(urls)
    return out


def _cni(spec: Mapping[str, Any]) -> dict[str, Any]:
    cni = _mapping(spec, "cni")
    preset = cni.get("preset")
    urls = tuple(
        _url({"url": u}, "url", schemes=("https", "http"), where=f"spec.cni.urls[{i}]")
        for i, u in enumerate(_str_list(cni, "urls", where="spec.cni"))
    )
    if preset is not None and preset not in CNI_PRESETS:
        raise RenderInputError("spec.cni.preset", f"{preset!r} is not a CNI preset",
                               "use flannel, cilium or unmanaged, or give spec.cni.urls for a custom CNI")
    if urls and preset is not None:
        raise RenderInputError("spec.cni", f"preset {preset} and custom urls are both set",
                               "custom urls replace the preset: remove one of them")
    return {"cni_preset": preset or "flannel", "cni_urls": urls}


def patches_from_spec(spec: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """``patches``: each a YAML/JSON text, or an inline mapping / JSON6902 list (dumped to text)."""
    value = spec.get("patches")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RenderInputError(where, "must be a list of patches", "give each patch as a YAML string")
    out = []
    for i, patch in enumerate(value):
        if isinstance(patch, str) and patch.strip():
            out.append(patch)
        elif isinstance(patch, Mapping | list) and patch:
            out.append(yamlio.dump(patch))
        else:
            raise RenderInputError(f"{where}[{i}]", "is empty or not a patch",
                                   "give a strategic merge patch or a JSON6902 list")
    return tuple(out)
