"""Talos's key order (Go struct field order) for the documents and sections ichord renders.

Talos marshals structs, so a key a patch adds lands at its field's place, not at the end. After
patching we re-sort the mappings we know: known keys in struct order, unknown keys after them in
the order they came; the Go map fields we know (labels, sysctls, extraArgs...) in sorted key order,
as Go's YAML encoder writes maps, and the free-form objects (meta.Unstructured: a kubelet config,
an admission plugin's configuration...) sorted at every depth, being Go maps all the way down.
Only order changes, never values (file modes are written in octal, as Talos's FileMode writes
them: the same number).
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarint import OctalInt

from ichord.render.config import V1ALPHA1

Path = tuple[str, ...]
_HEAD = ("apiVersion", "kind")
_PAIR = ("crt", "key")

_V1ALPHA1: dict[Path, tuple[str, ...]] = {
    (): ("version", "debug", "persist", "machine", "cluster"),
    ("machine",): (
        "type", "token", "ca", "acceptedCAs", "certSANs", "controlPlane", "kubelet", "pods", "network", "disks",
        "install", "files", "env", "time", "sysctls", "sysfs", "registries", "systemDiskEncryption", "features",
        "udev", "logging", "kernel", "seccompProfiles", "baseRuntimeSpecOverrides", "nodeLabels",
        "nodeAnnotations", "nodeTaints",
    ),
    ("machine", "ca"): _PAIR,
    ("machine", "kubelet"): (
        "image", "clusterDNS", "extraArgs", "extraMounts", "extraConfig", "credentialProviderConfig",
        "defaultRuntimeSeccompProfileEnabled", "registerWithFQDN", "nodeIP", "skipNodeRegistration",
        "disableManifestsDirectory",
    ),
    ("machine", "kubelet", "extraMounts", "[]"): ("destination", "type", "source", "options", "uidMappings",
                                                  "gidMappings"),
    ("machine", "network"): ("hostname", "interfaces", "nameservers", "searchDomains", "extraHostEntries", "kubespan",
                             "disableSearchDomain"),
    ("machine", "install"): ("disk", "diskSelector", "extraKernelArgs", "image", "extensions", "bootloader", "wipe",
                             "legacyBIOSSupport", "grubUseUKICmdline"),
    ("machine", "kubelet", "nodeIP"): ("validSubnets",),
    ("machine", "files", "[]"): ("content", "permissions", "path", "op"),
    ("machine", "time"): ("disabled", "servers", "bootTimeout"),
    ("machine", "features"): ("rbac", "stableHostname", "kubernetesTalosAPIAccess", "apidCheckExtKeyUsage",
                              "diskQuotaSupport", "kubePrism", "hostDNS", "imageCache", "nodeAddressSortAlgorithm"),
    ("cluster",): (
        "id", "secret", "controlPlane", "clusterName", "network", "token", "aescbcEncryptionSecret",
        "secretboxEncryptionSecret", "ca", "acceptedCAs", "aggregatorCA", "serviceAccount", "apiServer",
        "controllerManager", "proxy", "scheduler", "discovery", "etcd", "coreDNS", "externalCloudProvider",
        "extraManifests", "extraManifestHeaders", "inlineManifests", "adminKubeconfig",
        "allowSchedulingOnControlPlanes",
    ),
    ("cluster", "controlPlane"): ("endpoint", "localAPIServerPort"),
    ("cluster", "network"): ("cni", "dnsDomain", "podSubnets", "serviceSubnets"),
    ("cluster", "ca"): _PAIR,
    ("cluster", "aggregatorCA"): _PAIR,
    ("cluster", "apiServer"): ("image", "extraArgs", "extraVolumes", "env", "certSANs", "disablePodSecurityPolicy",
                               "admissionControl", "auditPolicy", "resources"),
    ("cluster", "controllerManager"): ("image", "extraArgs", "extraVolumes", "env", "resources"),
    ("cluster", "proxy"): ("disabled", "image", "mode", "extraArgs"),
    ("cluster", "scheduler"): ("image", "extraArgs", "extraVolumes", "env", "resources", "config"),
    ("cluster", "etcd"): ("image", "ca", "extraArgs", "advertisedSubnets", "listenSubnets"),
    ("cluster", "coreDNS"): ("disabled", "image"),
    ("cluster", "etcd", "ca"): _PAIR,
    ("cluster", "discovery"): ("enabled", "registries"),
}

#: Go map fields (all omitempty): written in sorted key order, left out when empty.
_ARGS = frozenset({("extraArgs",)})
_MAPS: dict[str, frozenset[Path]] = {
    V1ALPHA1: frozenset({
        ("machine", "env"), ("machine", "sysctls"), ("machine", "sysfs"), ("machine", "nodeLabels"),
        ("machine", "nodeAnnotations"), ("machine", "nodeTaints"), ("machine", "kubelet", "extraArgs"),
        ("cluster", "extraManifestHeaders"), ("cluster", "apiServer", "extraArgs"), ("cluster", "apiServer", "env"),
        ("cluster", "controllerManager", "extraArgs"), ("cluster", "controllerManager", "env"),
        ("cluster", "proxy", "extraArgs"), ("cluster", "scheduler", "extraArgs"), ("cluster", "scheduler", "env"),
        ("cluster", "etcd", "extraArgs"),
    }),
    "SysctlConfig": frozenset({("params",)}),
    "KubeletConfig": _ARGS,
    "KubeNodeConfig": frozenset({("labels",), ("annotations",), ("taints",)}),
    "KubeAPIServerConfig": frozenset({("extraArgs",), ("env",)}),
    "KubeControllerManagerConfig": frozenset({("extraArgs",), ("env",)}),
    "KubeSchedulerConfig": frozenset({("extraArgs",), ("env",)}),
    "KubeProxyConfig": _ARGS,
    "KubeExternalManifestConfig": frozenset({("headers",)}),
}

#: Free-form object fields (meta.Unstructured, a Go map[string]any): sorted at every depth.
_RESOURCES = frozenset({("resources", "requests"), ("resources", "limits")})
_UNSTRUCTURED: dict[str, frozenset[Path]] = {
    V1ALPHA1: frozenset({
        ("machine", "kubelet", "extraConfig"), ("machine", "kubelet", "credentialProviderConfig"),
        ("machine", "baseRuntimeSpecOverrides"), ("machine", "pods", "[]"), ("cluster", "apiServer", "auditPolicy"),
        ("cluster", "apiServer", "admissionControl", "[]", "configuration"), ("cluster", "scheduler", "config"),
        *((section, "resources", limit) for section in ("apiServer", "controllerManager", "scheduler")
          for limit in ("requests", "limits")),
    }),
    "KubeletConfig": frozenset({("config",)}),
    "KubeSchedulerConfig": frozenset({("config",), *_RESOURCES}),
    "KubeProxyConfig": frozenset({("config",), *_RESOURCES}),
    "KubeAPIServerConfig": _RESOURCES,
    "KubeControllerManagerConfig": _RESOURCES,
    "KubeFlannelCNIConfig": frozenset({("backendExtraConfig",), *_RESOURCES}),
    "KubeAdmissionControlConfig": frozenset({("configuration",)}),
    "KubeAuditPolicyConfig": frozenset({("configuration",)}),
    "KubeAuthenticationConfig": frozenset({("configuration",)}),
    "KubeAuthorizerConfig": frozenset({("webhook",)}),
    "KubeCredentialProviderConfig": frozenset({("configuration",)}),
    "KubeEtcdEncryptionConfig": frozenset({("config",)}),
    "KubeStaticPodConfig": frozenset({("pod",)}),
}

#: Typed documents ichord generates (field order of their Go structs / the JSON schema).
_TYPED: dict[str, tuple[str, ...]] = {
    "DiscoveryServiceConfig": ("name", "endpoint"),
    "DiscoveryIdentityConfig": ("clusterID", "clusterSecret"),
    "UnattendedInstallConfig": ("reboot", "installer", "provisioning"),
    "ResolverConfig": ("nameservers", "searchDomains", "hostDNS"),
    "SysctlConfig": ("params",),
    "VolumeConfig": ("name", "provisioning", "filesystem", "encryption", "mount", "trim", "scrub"),
    "FilesystemTrimConfig": ("interval",),
    "SecurityProfileConfig": ("workloadIsolation",),
    "RegistryMirrorConfig": ("name", "endpoints", "skipFallback"),
    "HostnameConfig": ("auto", "hostname"),
    "KubeClusterConfig": ("clusterName", "endpoint"),
    "KubeNodeConfig": ("skipNodeRegistration", "registerWithFQDN", "nodeIP", "labels", "annotations", "taints"),
    "KubeletConfig": ("image", "config", "extraArgs", "clusterDNS", "defaultRuntimeSeccompProfileEnabled"),
    "KubeNetworkConfig": ("dnsDomain", "podSubnets", "serviceSubnets", "nodeCIDRMaskSizeIPv4",
                          "nodeCIDRMaskSizeIPv6"),
    "KubeAPIServerCAConfig": ("issuingCA", "acceptedCAs"),
    "KubeAggregatorCAConfig": ("issuingCA", "acceptedCAs"),
    "KubePrismConfig": ("port", "tlsServerName"),
    "KubeAdmissionControlConfig": ("name", "configuration"),
    "KubeAuditPolicyConfig": ("configuration",),
    "KubeAuthenticationConfig": ("configuration",),
    "KubeAuthorizerConfig": ("name", "type", "webhook"),
    "KubeEtcdEncryptionConfig": ("config",),
    "KubeServiceAccountConfig": ("issuer", "accepted"),
    "KubeAPIServerConfig": ("image", "extraArgs", "env", "resources", "apiPort", "certExtraSANs", "startupProbes"),
    "KubeControllerManagerConfig": ("enabled", "image", "extraArgs", "env", "resources"),
    "KubeSchedulerConfig": ("enabled", "image", "config", "extraArgs", "env", "resources"),
    "KubeProxyConfig": ("enabled", "image", "mode", "config", "extraArgs", "resources"),
    "KubeFlannelCNIConfig": ("backendType", "backendPort", "backendMTU", "backendExtraConfig", "resources",
                             "extraArgs", "kubeNetworkPoliciesEnabled"),
    "KubeCoreDNSConfig": ("enabled", "image"),
    "KubeExternalManifestConfig": ("name", "headers", "url"),
}
_TYPED_SUB: dict[tuple[str, Path], tuple[str, ...]] = {
    ("KubeAPIServerCAConfig", ("issuingCA",)): ("cert", "key"),
    ("KubeAggregatorCAConfig", ("issuingCA",)): ("cert", "key"),
    ("KubeServiceAccountConfig", ("issuer",)): ("privateKey", "issuerURL"),
    ("KubeServiceAccountConfig", ("accepted",)): ("publicKeys", "issuers", "audiences"),
    ("UnattendedInstallConfig", ("provisioning",)): ("diskSelector", "wipe"),
    ("ResolverConfig", ("hostDNS",)): ("enabled", "forwardKubeDNSToHost", "resolveMemberNames"),
    ("RegistryMirrorConfig", ("endpoints", "[]")): ("url", "overridePath"),
}


def is_map(kind: str, path: Path) -> bool:
    """Whether the mapping at ``path`` of a ``kind`` document is a Go map field ("v1alpha1": legacy)."""
    return path in _MAPS.get(kind, frozenset())


def struct_fields(kind: str, path: Path) -> tuple[str, ...]:
    """The Go struct fields known for the mapping at ``path`` of a ``kind`` document ("v1alpha1" for
    the legacy one); empty when the mapping is not known to be a struct."""
    if kind == V1ALPHA1:
        return _V1ALPHA1.get(path, ())
    if not path:
        return _TYPED.get(kind, ())
    return _TYPED_SUB.get((kind, path), ())


def normalize(doc: CommentedMap) -> CommentedMap:
    """``doc`` with its known mappings in Talos's key order (a new tree; ``doc`` is untouched)."""
    kind = doc.get("kind")
    if kind is None and doc.get("version") == V1ALPHA1:
        out: CommentedMap = _walk(doc, (), _V1ALPHA1.get, _MAPS[V1ALPHA1], _UNSTRUCTURED[V1ALPHA1])
        for file in (out.get("machine") or {}).get("files") or []:
            mode = file.get("permissions") if isinstance(file, dict) else None
            if isinstance(mode, int) and not isinstance(mode, bool):
                file["permissions"] = OctalInt(mode)
        return out
    if isinstance(kind, str):
        top = (*_HEAD, *_TYPED[kind]) if kind in _TYPED else _HEAD
        typed: CommentedMap = _walk(doc, (), lambda p: top if not p else _TYPED_SUB.get((kind, p)),
                                    _MAPS.get(kind, frozenset()), _UNSTRUCTURED.get(kind, frozenset()))
        return typed
    return doc


def _walk(node: Any, path: Path, order_of: Any, maps: frozenset[Path], unstructured: frozenset[Path]) -> Any:
    if path in unstructured:
        return _sorted_deep(node)
    if isinstance(node, dict):
        order = order_of(path)
        keys = list(node)
        if path in maps:
            keys.sort(key=str)
        elif order:
            rank = {k: i for i, k in enumerate(order)}
            keys.sort(key=lambda k: rank.get(k, len(rank)))  # stable: unknown keys keep their order
        out = CommentedMap()
        for k in keys:
            out[k] = _walk(node[k], (*path, str(k)), order_of, maps, unstructured)
        return out
    if isinstance(node, list):
        return [_walk(v, (*path, "[]"), order_of, maps, unstructured) for v in node]
    return node


def _sorted_deep(node: Any) -> Any:
    if isinstance(node, dict):
        out = CommentedMap()
        for k in sorted(node, key=str):
            out[k] = _sorted_deep(node[k])
        return out
    if isinstance(node, list):
        return [_sorted_deep(v) for v in node]
    return node
