"""Typed reads of the Talos resources ichord needs (COSI ``cosi.resource.State``) and of Kubeconfig.

Specs are decoded from ``proto_spec`` (the typed encoding Talos fills next to ``yaml_spec``), so PEM
values arrive as raw PEM bytes. Values holding keys are never kept: only certificates come back.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from ichord.contract import VersionContract
from ichord.talos.errors import TalosProtocolError
from ichord.talos.proto.gen.resource.config import config_pb2
from ichord.talos.proto.gen.talos.definitions import enums_pb2, k8s_pb2, runtime_pb2, secrets_pb2, v1alpha1_pb2

# (namespace, type) of each resource, as Talos registers them (Talos's API definitions).
MACHINE_CONFIG = ("config", "MachineConfigs.config.talos.dev")
NODENAME = ("k8s", "Nodenames.kubernetes.talos.dev")
MACHINE_STATUS = ("runtime", "MachineStatuses.runtime.talos.dev")
BOOT_ID = ("runtime", "BootIDs.runtime.talos.dev")
ETCD_ROOT = ("secrets", "EtcdRootSecrets.secrets.talos.dev")
ETCD_CERTS = ("secrets", "EtcdSecrets.secrets.talos.dev")
OS_ROOT = ("secrets", "OSRootSecrets.secrets.talos.dev")
KUBERNETES_ROOT = ("secrets", "KubernetesRootSecrets.secrets.talos.dev")
STATIC_POD_STATUS = ("k8s", "StaticPodStatuses.kubernetes.talos.dev")
SERVICES = ("runtime", "Services.v1alpha1.talos.dev")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class MachineStatus:
    stage: str  # e.g. MACHINE_STAGE_RUNNING
    ready: bool
    unmet_conditions: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class OSRoot:
    issuing_ca: bytes
    accepted_cas: tuple[bytes, ...]
    can_issue: bool  # the node holds the key (control planes)


@dataclass(frozen=True)
class KubernetesRoot:
    issuing_ca: bytes
    accepted_cas: tuple[bytes, ...]
    aggregator_ca: bytes
    accepted_aggregator_cas: tuple[bytes, ...]


@dataclass(frozen=True)
class EtcdRoot:
    ca_bundle: bytes  # the whole cluster.etcd.ca.crt field: first block signs, all are trusted


@dataclass(frozen=True)
class EtcdCerts:
    etcd: bytes
    etcd_peer: bytes
    etcd_admin: bytes
    etcd_api_server: bytes


@dataclass(frozen=True)
class ServiceStatus:
    id: str
    running: bool
    healthy: bool
    unknown: bool


@dataclass(frozen=True)
class StaticPodStatus:
    id: str  # <namespace>/<pod name>
    pod_status: dict[str, Any] = field(hash=False)

    @property
    def container_ids(self) -> tuple[str, ...]:
        return tuple(str(c.get("containerID", "")) for c in self.pod_status.get("containerStatuses", []))

    @property
    def ready(self) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in self.pod_status.get("conditions", []))


class _Transport(Protocol):
    async def cosi_get(self, endpoint: str, namespace: str, rtype: str, rid: str, *,
                       node: str | None = None) -> Any: ...

    async def cosi_list(self, endpoint: str, namespace: str, rtype: str, *,
                        node: str | None = None) -> list[Any]: ...

    async def read(self, endpoint: str, path: str, *, node: str | None = None) -> bytes: ...

    async def kubeconfig_archive(self, endpoint: str, *, node: str | None = None) -> bytes: ...


def _spec(resource: Any, message: Message, endpoint: str) -> Any:
    data = resource.spec.proto_spec
    if not data:
        raise TalosProtocolError(endpoint, f"Get {resource.metadata.type}", "the resource carries no proto_spec")
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise TalosProtocolError(endpoint, f"Get {resource.metadata.type}", f"undecodable spec ({exc})") from None
    return message


class ResourceReads:
    """Typed reads; mixed into TalosClient."""

    async def machine_config(self: _Transport, endpoint: str, *, persistent: bool = False,
                             node: str | None = None) -> bytes:
        """The running (``v1alpha1``) or on-disk (``persistent``) configuration, bytes as submitted."""
        res = await self.cosi_get(endpoint, *MACHINE_CONFIG, "persistent" if persistent else "v1alpha1", node=node)
        return bytes(_spec(res, config_pb2.MachineConfigSpec(), endpoint).yaml_marshalled)

    async def nodename(self: _Transport, endpoint: str, *, node: str | None = None) -> str:
        res = await self.cosi_get(endpoint, *NODENAME, "nodename", node=node)
        return str(_spec(res, k8s_pb2.NodenameSpec(), endpoint).nodename)

    async def machine_status(self: _Transport, endpoint: str, *, node: str | None = None) -> MachineStatus:
        res = await self.cosi_get(endpoint, *MACHINE_STATUS, "machine", node=node)
        spec = _spec(res, runtime_pb2.MachineStatusSpec(), endpoint)
        return MachineStatus(enums_pb2.RuntimeMachineStage.Name(spec.stage), spec.status.ready,
                             tuple((c.name, c.reason) for c in spec.status.unmet_conditions))

    async def boot_id(self: _Transport, endpoint: str, contract: VersionContract, *,
                      node: str | None = None) -> str:
        """The BootID resource on v1.14 and later; the Read of /proc/sys/kernel/random/boot_id before."""
        if (contract.major, contract.minor) >= (1, 14):
            res = await self.cosi_get(endpoint, *BOOT_ID, "boot-id", node=node)
            return str(_spec(res, runtime_pb2.BootIDSpec(), endpoint).boot_id)
        return (await self.read(endpoint, BOOT_ID_PATH, node=node)).decode().strip()

    async def etcd_root(self: _Transport, endpoint: str, *, node: str | None = None) -> EtcdRoot:
        res = await self.cosi_get(endpoint, *ETCD_ROOT, "etcd", node=node)
        return EtcdRoot(bytes(_spec(res, secrets_pb2.EtcdRootSpec(), endpoint).etcd_ca.crt))

    async def etcd_certs(self: _Transport, endpoint: str, *, node: str | None = None) -> EtcdCerts:
        res = await self.cosi_get(endpoint, *ETCD_CERTS, "etcd", node=node)
        s = _spec(res, secrets_pb2.EtcdCertsSpec(), endpoint)
        return EtcdCerts(bytes(s.etcd.crt), bytes(s.etcd_peer.crt), bytes(s.etcd_admin.crt),
                         bytes(s.etcd_api_server.crt))

    async def os_root(self: _Transport, endpoint: str, *, node: str | None = None) -> OSRoot:
        res = await self.cosi_get(endpoint, *OS_ROOT, "os", node=node)
        s = _spec(res, secrets_pb2.OSRootSpec(), endpoint)
        return OSRoot(bytes(s.issuing_ca.crt), tuple(bytes(c.crt) for c in s.accepted_c_as), bool(s.issuing_ca.key))

    async def kubernetes_root(self: _Transport, endpoint: str, *, node: str | None = None) -> KubernetesRoot:
        res = await self.cosi_get(endpoint, *KUBERNETES_ROOT, "k8s", node=node)
        s = _spec(res, secrets_pb2.KubernetesRootSpec(), endpoint)
        return KubernetesRoot(bytes(s.issuing_ca.crt), tuple(bytes(c.crt) for c in s.accepted_c_as),
                              bytes(s.aggregator_ca.crt), tuple(bytes(c.crt) for c in s.accepted_aggregator_c_as))

    async def static_pod_statuses(self: _Transport, endpoint: str, *,
                                  node: str | None = None) -> list[StaticPodStatus]:
        out = []
        for res in await self.cosi_list(endpoint, *STATIC_POD_STATUS, node=node):
            spec = _spec(res, k8s_pb2.StaticPodStatusSpec(), endpoint)
            out.append(StaticPodStatus(res.metadata.id, json_format.MessageToDict(spec.pod_status)))
        return out

    async def services(self: _Transport, endpoint: str, *, node: str | None = None) -> dict[str, ServiceStatus]:
        out = {}
        for res in await self.cosi_list(endpoint, *SERVICES, node=node):
            s = _spec(res, v1alpha1_pb2.ServiceSpec(), endpoint)
            out[res.metadata.id] = ServiceStatus(res.metadata.id, s.running, s.healthy, s.unknown)
        return out

    async def kubeconfig(self: _Transport, endpoint: str, *, node: str | None = None) -> bytes:
        """The admin kubeconfig a control plane issues (Kubeconfig RPC), extracted from its archive."""
        archive = await self.kubeconfig_archive(endpoint, node=node)
        try:
            return extract_kubeconfig(archive)
        except ValueError as exc:
            raise TalosProtocolError(endpoint, "Kubeconfig", str(exc)) from None


def extract_kubeconfig(archive: bytes) -> bytes:
    """The ``kubeconfig`` file of a gzip tar; tolerates a tar without its end-of-archive blocks."""
    try:
        raw = gzip.decompress(archive)
    except (OSError, EOFError) as exc:
        raise ValueError(f"the kubeconfig archive is not gzip data ({exc})") from None
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for member in tar:
                if member.isfile() and member.name.lstrip("./") == "kubeconfig":
                    f = tar.extractfile(member)
                    if f is not None:
                        return f.read()
    except tarfile.TarError as exc:
        raise ValueError(f"the kubeconfig archive is not a tar ({exc})") from None
    raise ValueError("the kubeconfig archive holds no file named kubeconfig")
