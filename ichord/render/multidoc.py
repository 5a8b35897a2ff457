"""The v1.14 contract: the multi-document layout (MultidocKubernetesConfigSupported).

The v1alpha1 document keeps only machine identity, the Talos API CA, the tokens and the etcd CA;
everything else is a typed document, in the order `talosctl gen config` emits them
(stability/v1.14). Control-plane-only documents follow the shared ones.
"""

from __future__ import annotations

from ruamel.yaml.comments import CommentedMap

from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.render import documents as d
from ichord.render.inputs import DEFAULT_API_SERVER_PORT, ClusterInputs, MachineInputs


def generate(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> list[CommentedMap]:
    docs = [_v1alpha1(bundle, c, m)]
    docs.append(d.typed("DiscoveryServiceConfig", ("name", "default"), ("endpoint", d.DISCOVERY_ENDPOINT)))
    docs.append(d.typed("DiscoveryIdentityConfig", ("clusterID", bundle.cluster_id),
                        ("clusterSecret", bundle.cluster_secret)))
    if c.install_disk:
        # UnattendedInstallConfig replaces machine.install; Talos drops extra kernel args here
        # (the stability overrides pass foo=bar,bar=baz and the document carries none).
        docs.append(d.typed(
            "UnattendedInstallConfig",
            ("installer", {}),
            ("provisioning", {"diskSelector": {"match": f'disk.dev_path == "{c.install_disk}"'}, "wipe": False}),
        ))
    docs.append(d.typed("ResolverConfig", ("hostDNS", {"enabled": True, "forwardKubeDNSToHost": True})))
    if c.sysctls:
        docs.append(d.typed("SysctlConfig", ("params", dict(sorted(c.sysctls.items())))))  # a Go map: sorted
    docs.append(d.typed("VolumeConfig", ("name", "EPHEMERAL"), ("mount", {"secure": True})))
    docs.append(d.typed("FilesystemTrimConfig", ("interval", "168h0m0s")))
    docs.append(d.typed("SecurityProfileConfig", ("workloadIsolation", True)))
    docs.extend(d.registry_mirror_docs(c))
    docs.append(d.hostname_doc(m))
    docs.extend(_kubernetes_universal(bundle, c, m))
    if m.controlplane:
        docs.extend(_kubernetes_controlplane(bundle, c))
    return docs


def _v1alpha1(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> CommentedMap:
    os_key = _pem.b64_pem_encode(bundle.os.key_pem) if m.controlplane and bundle.os.key_pem else ""
    machine = d.cmap((
        ("type", m.role),
        ("token", bundle.trustd_token),
        ("ca", {"crt": _pem.b64_pem_encode(bundle.os.cert_pem), "key": os_key}),
        ("certSANs", list(c.additional_sans)),
        ("features", {"diskQuotaSupport": True}),
    ))
    cluster = d.cmap((("token", bundle.bootstrap_token),))
    if m.controlplane:
        cluster["etcd"] = d.cmap({"ca": _ca_pair(bundle.etcd.cert_pem, bundle.etcd.key_pem)})
    return d.cmap((("version", "v1alpha1"), ("debug", False), ("persist", True),
                   ("machine", machine), ("cluster", cluster)))


def _ca_pair(cert: bytes, key: bytes | None) -> dict[str, str]:
    return {"crt": _pem.b64_pem_encode(cert), "key": _pem.b64_pem_encode(key) if key else ""}


def _kubernetes_universal(bundle: SecretsBundle, c: ClusterInputs, m: MachineInputs) -> list[CommentedMap]:
    node = d.typed("KubeNodeConfig", ("nodeIP", {}))
    if m.controlplane:
        node["labels"] = d.cmap({d.LABEL_CONTROL_PLANE: "", d.LABEL_EXCLUDE_LB: ""})
        if not c.allow_scheduling_on_control_planes:
            node["taints"] = d.cmap({d.LABEL_CONTROL_PLANE: "NoSchedule"})
    if m.controlplane:
        assert bundle.k8s.key_pem is not None  # the bundle loader refuses a CA without its key
        ca = d.typed("KubeAPIServerCAConfig", ("issuingCA", {"cert": d.pem_text(bundle.k8s.cert_pem),
                                                             "key": d.pem_text(bundle.k8s.key_pem)}))
    else:
        ca = d.typed("KubeAPIServerCAConfig", ("acceptedCAs", [d.pem_text(bundle.k8s.cert_pem)]))
    return [
        d.typed("KubeClusterConfig", ("clusterName", c.cluster_name), ("endpoint", c.endpoint)),
        node,
        d.typed("KubeletConfig", ("image", d.kubelet_image(c)), ("config", {}),
                ("defaultRuntimeSeccompProfileEnabled", True)),
        d.typed("KubeNetworkConfig", ("dnsDomain", c.dns_domain), ("podSubnets", list(d.POD_SUBNETS)),
                ("serviceSubnets", list(d.SERVICE_SUBNETS))),
        ca,
        d.typed("KubePrismConfig", ("port", d.KUBEPRISM_PORT)),
    ]


def _kubernetes_controlplane(bundle: SecretsBundle, c: ClusterInputs) -> list[CommentedMap]:
    agg = bundle.k8s_aggregator
    assert agg.key_pem is not None
    apiserver = d.typed("KubeAPIServerConfig", ("image", d.k8s_image("kube-apiserver", c)))
    if c.local_api_server_port != DEFAULT_API_SERVER_PORT:
        apiserver["apiPort"] = c.local_api_server_port
    if c.additional_sans:
        apiserver["certExtraSANs"] = list(c.additional_sans)
    docs = [
        d.typed("KubeAggregatorCAConfig", ("issuingCA", {"cert": d.pem_text(agg.cert_pem),
                                                         "key": d.pem_text(agg.key_pem)})),
        d.typed("KubeAdmissionControlConfig", ("name", "PodSecurity"),
                ("configuration", d.pod_security_configuration())),
        d.typed("KubeAuditPolicyConfig", ("configuration", d.audit_policy())),
        d.typed("KubeAuthenticationConfig", ("configuration", {
            "anonymous": {"conditions": [{"path": "/livez"}, {"path": "/readyz"}, {"path": "/healthz"}],
                          "enabled": True},
            "jwt": [],
        })),
        d.typed("KubeAuthorizerConfig", ("name", "node"), ("type", "Node")),
        d.typed("KubeAuthorizerConfig", ("name", "rbac"), ("type", "RBAC")),
        d.typed("KubeEtcdEncryptionConfig", ("config", {
            "resources": [{"providers": d.encryption_providers(bundle), "resources": ["secrets"]}],
        })),
        d.typed("KubeServiceAccountConfig", ("issuer", {
            "privateKey": d.pem_text(bundle.k8s_service_account_key),
            "issuerURL": c.endpoint,
        })),
        apiserver,
        d.typed("KubeControllerManagerConfig", ("image", d.k8s_image("kube-controller-manager", c))),
        d.typed("KubeSchedulerConfig", ("image", d.k8s_image("kube-scheduler", c)), ("config", {})),
        d.typed("KubeProxyConfig", ("image", d.k8s_image("kube-proxy", c)), ("config", {})),
    ]
    # Flannel is Talos's default CNI. Talos's generator (generate/kubernetes.go) adds
    # KubeFlannelCNIConfig only when no custom CNI URL is given; it has no "none" option, whose
    # multi-document form is the absence of that document (what `$patch: delete` of it leaves).
    # So cilium (installed by the user) and unmanaged omit it, like custom URLs do.
    if c.cni_preset == "flannel" and not c.cni_custom:
        docs.append(d.typed("KubeFlannelCNIConfig", ("backendType", d.FLANNEL_BACKEND),
                            ("backendPort", d.FLANNEL_PORT)))
    docs.append(d.typed("KubeCoreDNSConfig", ("enabled", True)))
    for i, url in enumerate(c.cni_urls):
        # Talos names its one custom CNI manifest `custom-cni`; further URLs get a numbered suffix.
        name = d.CUSTOM_CNI_MANIFEST if i == 0 else f"{d.CUSTOM_CNI_MANIFEST}-{i + 1}"
        docs.append(d.typed("KubeExternalManifestConfig", ("name", name), ("url", url)))
    return docs
