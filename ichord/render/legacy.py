"""The v1.13 contract: the legacy layout, everything Kubernetes in the v1alpha1 document.

Mirrors stability/v1.13: the v1alpha1 document (keys in Talos's struct order), then one
RegistryMirrorConfig per mirror and the HostnameConfig document.
"""

from __future__ import annotations

from ruamel.yaml.comments import CommentedMap

from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.render import documents as d
from ichord.render.inputs import DEFAULT_API_SERVER_PORT, ClusterInputs, MachineInputs


def generate(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> list[CommentedMap]:
    v1alpha1 = d.cmap((("version", "v1alpha1"), ("debug", False), ("persist", True),
                       ("machine", _machine(bundle, c, m)), ("cluster", _cluster(bundle, c, m))))
    return [v1alpha1, *d.registry_mirror_docs(c), d.hostname_doc(m)]


def _pair(cert: bytes, key: bytes | None, *, with_key: bool) -> dict[str, str]:
    # Talos always writes `key`; a CA without its key (workers) is `key: ""`.
    return {"crt": _pem.b64_pem_encode(cert), "key": _pem.b64_pem_encode(key) if with_key and key else ""}


def _machine(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> CommentedMap:
    install: dict[str, object] = {}
    if c.install_disk:
        install["disk"] = c.install_disk
    if c.install_extra_kernel_args:
        install["extraKernelArgs"] = list(c.install_extra_kernel_args)
    install.update({"wipe": False, "grubUseUKICmdline": True})
    machine = d.cmap((
        ("type", m.role),
        ("token", bundle.trustd_token),
        ("ca", _pair(bundle.os.cert_pem, bundle.os.key_pem, with_key=m.controlplane)),
        ("certSANs", list(c.additional_sans)),
        ("kubelet", {"image": d.kubelet_image(c), "defaultRuntimeSeccompProfileEnabled": True,
                     "disableManifestsDirectory": True}),
        ("install", install),
    ))
    if c.sysctls:
        machine["sysctls"] = d.cmap(dict(sorted(c.sysctls.items())))  # a Go map: sorted keys
    machine["features"] = d.cmap({
        "diskQuotaSupport": True,
        "kubePrism": {"enabled": True, "port": d.KUBEPRISM_PORT},
        "hostDNS": {"enabled": True, "forwardKubeDNSToHost": True},
    })
    if m.controlplane:
        machine["nodeLabels"] = d.cmap({d.LABEL_EXCLUDE_LB: ""})
    return machine


def _cluster(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> CommentedMap:
    control_plane: dict[str, object] = {"endpoint": c.endpoint}
    if m.controlplane and c.local_api_server_port != DEFAULT_API_SERVER_PORT:
        control_plane["localAPIServerPort"] = c.local_api_server_port
    network: dict[str, object] = {}
    if c.cni_custom:
        network["cni"] = {"name": "custom", "urls": list(c.cni_urls)}
    elif c.cni_preset != "flannel":
        # cilium (installed by the user / helm) and unmanaged: Talos installs no CNI.
        network["cni"] = {"name": "none"}
    network.update({"dnsDomain": c.dns_domain, "podSubnets": list(d.POD_SUBNETS),
                    "serviceSubnets": list(d.SERVICE_SUBNETS)})
    cluster = d.cmap((
        ("id", bundle.cluster_id),
        ("secret", bundle.cluster_secret),
        ("controlPlane", control_plane),
        ("clusterName", c.cluster_name),
        ("network", network),
        ("token", bundle.bootstrap_token),
    ))
    if m.controlplane:
        if bundle.secretbox_encryption_secret:
            cluster["secretboxEncryptionSecret"] = bundle.secretbox_encryption_secret
        else:
            cluster["aescbcEncryptionSecret"] = bundle.aescbc_encryption_secret
    cluster["ca"] = d.cmap(_pair(bundle.k8s.cert_pem, bundle.k8s.key_pem, with_key=m.controlplane))
    if m.controlplane:
        agg = bundle.k8s_aggregator
        cluster["aggregatorCA"] = d.cmap(_pair(agg.cert_pem, agg.key_pem, with_key=True))
        cluster["serviceAccount"] = d.cmap({"key": _pem.b64_pem_encode(bundle.k8s_service_account_key)})
        apiserver: dict[str, object] = {"image": d.k8s_image("kube-apiserver", c)}
        if c.additional_sans:
            apiserver["certSANs"] = list(c.additional_sans)
        apiserver["admissionControl"] = [{"name": "PodSecurity", "configuration": d.pod_security_configuration()}]
        apiserver["auditPolicy"] = d.audit_policy()
        cluster["apiServer"] = d.cmap(apiserver)
        cluster["controllerManager"] = d.cmap({"image": d.k8s_image("kube-controller-manager", c)})
        cluster["proxy"] = d.cmap({"image": d.k8s_image("kube-proxy", c)})
        cluster["scheduler"] = d.cmap({"image": d.k8s_image("kube-scheduler", c)})
    cluster["discovery"] = d.cmap({"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}})
    if m.controlplane:
        cluster["etcd"] = d.cmap({"ca": _pair(bundle.etcd.cert_pem, bundle.etcd.key_pem, with_key=True)})
        if c.allow_scheduling_on_control_planes:
            cluster["allowSchedulingOnControlPlanes"] = True
    return cluster
