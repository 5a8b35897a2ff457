"""Building blocks both layouts share: defaults, images and the typed documents of either contract.

Every value here is what `talosctl gen config` writes (stability files in
../shared/reference/talos/stability); key order is Talos's struct order so output reads like Talos's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ruamel.yaml.comments import CommentedMap

from ichord import yamlio
from ichord.pki.bundle import SecretsBundle
from ichord.render.inputs import ClusterInputs, MachineInputs

API_VERSION = "v1alpha1"
POD_SUBNETS = ("10.244.0.0/16",)
SERVICE_SUBNETS = ("10.96.0.0/12",)
KUBEPRISM_PORT = 7445
DISCOVERY_ENDPOINT = "https://discovery.talos.dev/"
FLANNEL_BACKEND = "vxlan"
FLANNEL_PORT = 4789
CUSTOM_CNI_MANIFEST = "custom-cni"
LABEL_CONTROL_PLANE = "node-role.kubernetes.io/control-plane"
LABEL_EXCLUDE_LB = "node.kubernetes.io/exclude-from-external-load-balancers"


def cmap(items: Iterable[tuple[str, Any]] | dict[str, Any] = ()) -> CommentedMap:
    """An ordered mapping, converting nested dicts/lists so the whole tree encodes alike."""
    out = CommentedMap()
    for k, v in (items.items() if isinstance(items, dict) else items):
        out[k] = tree(v)
    return out


def tree(value: Any) -> Any:
    if isinstance(value, dict):
        return cmap(value)
    if isinstance(value, list | tuple):
        return [tree(v) for v in value]
    return value


def typed(kind: str, *fields: tuple[str, Any]) -> CommentedMap:
    return cmap((("apiVersion", API_VERSION), ("kind", kind), *fields))


def pem_text(pem: bytes) -> Any:
    """PEM as the 1.14 documents hold it: raw text in a literal block scalar."""
    return yamlio.literal(pem.decode("ascii"))


# ---- images ---------------------------------------------------------------------------------


def kubelet_image(c: ClusterInputs) -> str:
    return f"ghcr.io/siderolabs/kubelet:v{c.kubernetes_version}"


def k8s_image(component: str, c: ClusterInputs) -> str:
    return f"registry.k8s.io/{component}:v{c.kubernetes_version}"


# ---- shared Kubernetes API server settings --------------------------------------------------


def pod_security_configuration() -> dict[str, Any]:
    """Talos's default PodSecurity admission configuration (keys sorted, as Talos writes the map)."""
    return {
        "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
        "defaults": {
            "audit": "restricted",
            "audit-version": "latest",
            "enforce": "baseline",
            "enforce-version": "latest",
            "warn": "restricted",
            "warn-version": "latest",
        },
        "exemptions": {"namespaces": ["kube-system"], "runtimeClasses": [], "usernames": []},
        "kind": "PodSecurityConfiguration",
    }


def audit_policy() -> dict[str, Any]:
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


def encryption_providers(bundle: SecretsBundle) -> list[dict[str, Any]]:
    """etcd encryption providers; Talos names the secretbox key ``key2`` and the aescbc key ``key1``."""
    if bundle.secretbox_encryption_secret:
        return [{"secretbox": {"keys": [{"name": "key2", "secret": bundle.secretbox_encryption_secret}]}}]
    return [{"aescbc": {"keys": [{"name": "key1", "secret": bundle.aescbc_encryption_secret}]}}]


# ---- typed documents both contracts emit ----------------------------------------------------


def registry_mirror_docs(c: ClusterInputs) -> list[CommentedMap]:
    # Registries sorted so a mapping's order never changes the render (Talos iterates a Go map).
    return [
        typed("RegistryMirrorConfig", ("name", registry),
              ("endpoints", [{"url": u} for u in c.registry_mirrors[registry]]))
        for registry in sorted(c.registry_mirrors)
    ]


def hostname_doc(m: MachineInputs) -> CommentedMap:
    if m.hostname:
        # A fixed hostname turns automatic naming off (HostnameConfig: auto, hostname).
        return typed("HostnameConfig", ("auto", "off"), ("hostname", m.hostname))
    return typed("HostnameConfig", ("auto", "stable"))
