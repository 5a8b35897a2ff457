"""The COSI resources a simulated node serves, built from its state (both proto_spec and yaml_spec).

Access rules are Talos's (``internal/app/resources/access.go``): writes are refused, a type without a
resource definition is refused, sensitive types need os:admin, the namespace must match.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf import struct_pb2
from google.protobuf.message import Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from ichord import yamlio
from ichord.contract import V1_14
from ichord.render import wire
from ichord.sim.talos.certs import sign_leaf
from ichord.talos.proto.gen.common import common_pb2
from ichord.talos.proto.gen.cosi import meta_pb2, resource_pb2
from ichord.talos.proto.gen.resource.config import config_pb2
from ichord.talos.proto.gen.talos.definitions import enums_pb2, k8s_pb2, runtime_pb2, secrets_pb2, v1alpha1_pb2

if TYPE_CHECKING:
    from ichord.render.config import MachineConfig
    from ichord.sim.talos.node import SimNode

from cryptography.x509.oid import ExtendedKeyUsageOID


@dataclass(frozen=True)
class ResourceType:
    namespace: str
    type: str
    sensitive: bool
    ids: Callable[[SimNode], list[str]]
    build: Callable[[SimNode, str], tuple[Message, Any] | None]  # (proto spec, YAML spec) or None
    since_v114: bool = False
    #: The resource definition's own aliases and print columns (machinery's ResourceDefinition()).
    aliases: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()


def _pem_pair(crt: bytes, key: bytes | None) -> tuple[common_pb2.PEMEncodedCertificateAndKey, dict[str, str]]:
    y = {"crt": base64.b64encode(crt).decode(), "key": base64.b64encode(key or b"").decode()}
    return common_pb2.PEMEncodedCertificateAndKey(crt=crt, key=key or b""), y


def encoded_config(node: SimNode, cfg: MachineConfig) -> bytes:
    """The bytes a COSI Get of ``cfg`` (the node's running or persistent configuration) returns."""
    return node.wire_of(cfg)


def _machine_config(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    cfg = node.running if rid == "v1alpha1" else node.persistent
    data = encoded_config(node, cfg)
    return config_pb2.MachineConfigSpec(yaml_marshalled=data), data.decode()


def _nodename(node: SimNode, rid: str) -> tuple[Message, Any]:
    return (k8s_pb2.NodenameSpec(nodename=node.nodename, hostname_version="1"),
            {"nodename": node.nodename, "hostnameVersion": "1", "skipNodeRegistration": False})


def _machine_status(node: SimNode, rid: str) -> tuple[Message, Any]:
    ready = node.up and node.stage == "MACHINE_STAGE_RUNNING"
    unmet = [] if ready else [("nodeReady", "node is not ready")]
    spec = runtime_pb2.MachineStatusSpec(
        stage=enums_pb2.RuntimeMachineStage.Value(node.stage),
        status=runtime_pb2.MachineStatusStatus(
            ready=ready, unmet_conditions=[runtime_pb2.UnmetCondition(name=n, reason=r) for n, r in unmet]))
    stage = node.stage.removeprefix("MACHINE_STAGE_").lower()
    return spec, {"stage": stage, "status": {"ready": ready,
                                             "unmetConditions": [{"name": n, "reason": r} for n, r in unmet]}}


def _boot_id(node: SimNode, rid: str) -> tuple[Message, Any]:
    return runtime_pb2.BootIDSpec(boot_id=node.boot_id), {"bootID": node.boot_id}


def _etcd_root(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    ca = node.view.etcd_ca
    if ca is None or not node.is_control_plane:
        return None
    pair, y = _pem_pair(ca.cert_pem, ca.key_pem)
    return secrets_pb2.EtcdRootSpec(etcd_ca=pair), {"etcdCA": y}


def _etcd_certs(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    ca = node.view.etcd_ca
    if ca is None or ca.key_pem is None or not node.is_control_plane:
        return None
    cached = node.etcd_leaf_cache.get(ca.cert_pem)
    if cached is None:
        both = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
        cached = {
            "etcd": sign_leaf(ca.signer_pem, ca.key_pem, common_name=node.nodename, ips=[node.ip, "127.0.0.1"],
                              dns=[node.nodename, "localhost"], usages=both),
            "etcdPeer": sign_leaf(ca.signer_pem, ca.key_pem, common_name=node.nodename, ips=[node.ip],
                                  dns=[node.nodename], usages=both),
            "etcdAdmin": sign_leaf(ca.signer_pem, ca.key_pem, common_name="root",
                                   usages=(ExtendedKeyUsageOID.CLIENT_AUTH,)),
            "etcdAPIServer": sign_leaf(ca.signer_pem, ca.key_pem, common_name="kube-apiserver",
                                       usages=(ExtendedKeyUsageOID.CLIENT_AUTH,)),
        }
        node.etcd_leaf_cache = {ca.cert_pem: cached}
    pairs = {k: _pem_pair(*v) for k, v in cached.items()}
    spec = secrets_pb2.EtcdCertsSpec(etcd=pairs["etcd"][0], etcd_peer=pairs["etcdPeer"][0],
                                     etcd_admin=pairs["etcdAdmin"][0], etcd_api_server=pairs["etcdAPIServer"][0])
    return spec, {k: v[1] for k, v in pairs.items()}


def _os_root(node: SimNode, rid: str) -> tuple[Message, Any]:
    v = node.view
    pair, y = _pem_pair(v.os_ca.cert_pem, v.os_ca.key_pem)
    accepted = list(v.os_accepted)
    spec = secrets_pb2.OSRootSpec(issuing_ca=pair, token=v.token, cert_sandns_names=[node.nodename],
                                  accepted_c_as=[common_pb2.PEMEncodedCertificate(crt=c) for c in accepted])
    return spec, {"issuingCA": y, "certSANIPs": [node.ip], "certSANDNSNames": [node.nodename], "token": v.token,
                  "acceptedCAs": [{"crt": base64.b64encode(c).decode()} for c in accepted]}


def _k8s_root(node: SimNode, rid: str) -> tuple[Message, Any]:
    v = node.view
    issuing = v.k8s_issuing
    crt = issuing.cert_pem if issuing else (v.k8s_accepted[0] if v.k8s_accepted else b"")
    pair, y = _pem_pair(crt, issuing.key_pem if issuing else None)
    agg = v.aggregator_issuing
    apair, ay = _pem_pair(agg.cert_pem if agg else b"", agg.key_pem if agg else None)
    spec = secrets_pb2.KubernetesRootSpec(
        issuing_ca=pair, aggregator_ca=apair,
        accepted_c_as=[common_pb2.PEMEncodedCertificate(crt=c) for c in v.k8s_accepted],
        accepted_aggregator_c_as=[common_pb2.PEMEncodedCertificate(crt=c) for c in v.aggregator_accepted])
    return spec, {"issuingCA": y, "aggregatorCA": ay,
                  "acceptedCAs": [{"crt": base64.b64encode(c).decode()} for c in v.k8s_accepted],
                  "acceptedAggregatorCAs": [{"crt": base64.b64encode(c).decode()} for c in v.aggregator_accepted]}


def _static_pod_ids(node: SimNode) -> list[str]:
    if not node.is_control_plane:
        return []
    return [f"kube-system/{p}-{node.nodename}" for p in ("kube-apiserver", "kube-controller-manager",
                                                         "kube-scheduler")]


def _static_pod(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    if rid not in _static_pod_ids(node):
        return None
    apiserver = rid.startswith("kube-system/kube-apiserver-")
    ready = node.apiserver_serving if apiserver else True
    container = node.apiserver_container if apiserver else f"containerd://{rid.split('/')[1]}-{node.boot_id[:8]}"
    name = rid.split("/")[1].removesuffix("-" + node.nodename)
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"},
                       {"type": "ContainersReady", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": name, "containerID": container,
                               "ready": ready, "restartCount": node.apiserver_restarts if apiserver else 0}],
    }
    pod_status = struct_pb2.Struct()
    pod_status.update(status)
    return k8s_pb2.StaticPodStatusSpec(pod_status=pod_status), status


def _service(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    svc = node.services.get(rid)
    if svc is None or svc.state not in ("Running",):
        return None
    healthy = node.service_healthy(rid)
    return (v1alpha1_pb2.ServiceSpec(running=True, healthy=healthy, unknown=False),
            {"running": True, "healthy": healthy, "unknown": False})


RESOURCE_DEFINITIONS = "ResourceDefinitions.meta.cosi.dev"


def definition(t: ResourceType) -> tuple[meta_pb2.ResourceDefinitionSpec, dict[str, Any]]:
    """``t``'s ResourceDefinition as COSI fills it (cosi-project/runtime meta/spec Fill): the display type is
    the singular of the type's name, the automatic aliases its lower-case forms and its capitals' initials."""
    name, suffix = t.type.split(".", 1)
    display = _singular(name)
    aliases = [*t.aliases, display.lower()]
    all_aliases = [name.lower()] + [".".join([name.lower(), *suffix.split(".")[:i]])
                                    for i in range(1, len(suffix.split(".")))]
    capitals = "".join(ch for ch in name if ch.isupper())
    if len(capitals) > 1:
        aliases.append(capitals.lower())
        if not capitals.endswith("S"):
            aliases.append(capitals.lower() + "s")
    all_aliases += aliases
    spec = meta_pb2.ResourceDefinitionSpec(
        resource_type=t.type, display_type=display, default_namespace=t.namespace, aliases=aliases,
        all_aliases=all_aliases,
        print_columns=[meta_pb2.ResourceDefinitionSpec.PrintColumn(name=n, json_path=p) for n, p in t.columns],
        sensitivity=meta_pb2.ResourceDefinitionSpec.SENSITIVE if t.sensitive else
        meta_pb2.ResourceDefinitionSpec.NON_SENSITIVE)
    doc: dict[str, Any] = {"type": t.type, "displayType": display, "defaultNamespace": t.namespace,
                           "aliases": aliases, "allAliases": all_aliases,
                           "printColumns": [{"name": n, "jsonPath": p} for n, p in t.columns]}
    if t.sensitive:
        doc["sensitivity"] = "sensitive"
    return spec, doc


def _singular(name: str) -> str:
    """The singular of a COSI type name, for the plurals the simulated types use (Statuses, Services, ...IDs)."""
    if name.endswith("uses"):
        return name[:-2]
    return name[:-1] if name.endswith("s") else name


def _served(node: SimNode) -> list[ResourceType]:
    return [t for t in TYPES.values() if not (t.since_v114 and node.contract < V1_14)]


def _definition_ids(node: SimNode) -> list[str]:
    return sorted(t.type.lower() for t in _served(node))


def _resource_definition(node: SimNode, rid: str) -> tuple[Message, Any] | None:
    for t in _served(node):
        if t.type.lower() == rid:
            return definition(t)
    return None


TYPES: dict[str, ResourceType] = {t.type.lower(): t for t in (
    ResourceType("config", "MachineConfigs.config.talos.dev", True, lambda n: ["persistent", "v1alpha1"],
                 _machine_config),
    ResourceType("k8s", "Nodenames.kubernetes.talos.dev", False, lambda n: ["nodename"], _nodename,
                 columns=(("Nodename", "{.nodename}"),)),
    ResourceType("runtime", "MachineStatuses.runtime.talos.dev", False, lambda n: ["machine"], _machine_status,
                 columns=(("Stage", "{.stage}"), ("Ready", "{.status.ready}"))),
    ResourceType("runtime", "BootIDs.runtime.talos.dev", False, lambda n: ["boot-id"], _boot_id, since_v114=True,
                 columns=(("Boot ID", "{.bootID}"),)),
    ResourceType("secrets", "EtcdRootSecrets.secrets.talos.dev", True, lambda n: ["etcd"], _etcd_root),
    ResourceType("secrets", "EtcdSecrets.secrets.talos.dev", True, lambda n: ["etcd"], _etcd_certs),
    ResourceType("secrets", "OSRootSecrets.secrets.talos.dev", True, lambda n: ["os"], _os_root),
    ResourceType("secrets", "KubernetesRootSecrets.secrets.talos.dev", True, lambda n: ["k8s"], _k8s_root),
    ResourceType("k8s", "StaticPodStatuses.kubernetes.talos.dev", False, _static_pod_ids, _static_pod,
                 aliases=("podstatus",), columns=(("Ready", '{.conditions[?(@.type=="Ready")].status}'),)),
    ResourceType("runtime", "Services.v1alpha1.talos.dev", False, lambda n: sorted(n.services), _service,
                 aliases=("svc",), columns=(("Running", "{.running}"), ("Healthy", "{.healthy}"),
                                            ("Health Unknown", "{.unknown}"))),
    ResourceType("meta", RESOURCE_DEFINITIONS, False, _definition_ids, _resource_definition,
                 aliases=("api-resources",), columns=(("Aliases", "{.aliases[:]}"),)),
)}
NAMESPACES = {"config", "k8s", "runtime", "secrets", "cluster", "network", "controlplane", "etcd", "files", "meta"}


def resolve(node: SimNode, namespace: str, rtype: str, roles: tuple[str, ...]) -> ResourceType:
    """The type, or the GRPCError Talos's access filter answers."""
    t = TYPES.get(rtype.lower())
    if t is None or (t.since_v114 and node.contract < V1_14):
        raise GRPCError(Status.PERMISSION_DENIED, f"resource type {rtype!r} is not supported")
    if t.sensitive and "os:admin" not in roles:
        raise GRPCError(Status.PERMISSION_DENIED, "not authorized")
    if namespace not in NAMESPACES:
        raise GRPCError(Status.NOT_FOUND, f"namespace {namespace!r} is not registered")
    return t


def build(node: SimNode, t: ResourceType, namespace: str, rid: str) -> resource_pb2.Resource | None:
    if namespace != t.namespace:
        return None
    built = t.build(node, rid) if rid in t.ids(node) else None
    if built is None:
        return None
    spec, yaml_spec = built
    version = node.resource_versions.get((t.type, rid), 0) + 1
    now = dt.datetime.now(dt.UTC)
    meta = resource_pb2.Metadata(namespace=namespace, type=t.type, id=rid, version=str(version),
                                 owner="", phase="running")
    meta.created.FromDatetime(now)
    meta.updated.FromDatetime(now)
    if t.type.startswith("MachineConfigs."):
        meta.annotations["talos.dev/yaml-spec"] = "1"
        text = _yaml(yaml_spec) if not isinstance(yaml_spec, str) else _scalar(yaml_spec)
    else:
        text = _yaml(yaml_spec)
    return resource_pb2.Resource(metadata=meta, spec=resource_pb2.Spec(proto_spec=spec.SerializeToString(),
                                                                       yaml_spec=text))


def _yaml(spec: Any) -> str:
    """A resource's YAML spec: libyaml's emitter (render/wire.py), ruamel's for what it does not write.

    Every verification read of a rotation pass is a Get of a certificate resource: ruamel's emitter was the
    simulated node's largest cost there."""
    try:
        return wire.encode([spec]).decode()
    except wire.WireEncodeError:
        return yamlio.dump(spec)


def _scalar(text: str) -> str:
    """The configuration as one YAML block scalar, as Talos encodes the MachineConfig spec."""
    return "|\n" + "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())


def tombstone(namespace: str, rtype: str, rid: str) -> resource_pb2.Resource:
    """What COSI's Watch of one ID starts with when the resource does not exist (resource.NewTombstone)."""
    return resource_pb2.Resource(metadata=resource_pb2.Metadata(namespace=namespace, type=rtype, id=rid,
                                                                version="undefined", phase="running"),
                                 spec=resource_pb2.Spec(yaml_spec="null\n"))


def not_found(t: ResourceType, namespace: str, rid: str) -> GRPCError:
    return GRPCError(Status.NOT_FOUND, f"resource {t.type}({namespace}/{rid}@undefined) doesn't exist")
