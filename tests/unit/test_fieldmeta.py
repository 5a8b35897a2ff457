"""fieldmeta: the diff of two machine configurations and what each change takes, per contract."""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml.comments import CommentedMap

from ichord.contract import V1_13, V1_14, UnsupportedContractError, VersionContract
from ichord.render.config import MachineConfig
from ichord.render.diff import ConfigDiffError, Op, diff
from ichord.render.diff_cli import DiffInputError, add_diff_parser
from ichord.render.fieldmeta import (
    TABLES,
    FieldmetaError,
    Impact,
    classify,
    normalize_role,
    summarize_paths,
)

SAFE, INSTALL, API, REBOOT, UNSUP = (
    Impact.SAFE,
    Impact.INSTALL_TIME_ONLY,
    Impact.API_SERVER_RESTART,
    Impact.REBOOT,
    Impact.UNSUPPORTED,
)
PEM = (
    "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIEYlYh75SQ6zUBEMFzzniS6nUX7CeqCMwKy4E6GTEE0c\n"
    "-----END EC PRIVATE KEY-----\n"
)


def typed(kind: str, name: str | None = None, **body: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": "v1alpha1", "kind": kind}
    if name is not None:
        doc["name"] = name
    doc.update(body)
    return doc


def base_docs() -> list[dict[str, Any]]:
    """A control plane's configuration carrying every document and field the table rows touch."""
    v1 = {
        "version": "v1alpha1",
        "debug": False,
        "persist": True,
        "machine": {
            "type": "controlplane",
            "token": "d8cwfa.eyvpi0xwxyarbfid",
            "ca": {"crt": "Y3J0", "key": "a2V5"},
            "certSANs": ["a"],
            "kubelet": {"image": "kubelet:v1"},
            "install": {"disk": "/dev/sda", "wipe": False},
            "features": {"diskQuotaSupport": True, "kubePrism": {"enabled": True, "port": 7445}},
            "sysctls": {"net.ipv4.ip_forward": "1"},
            "network": {"hostname": "cp1"},
        },
        "cluster": {
            "id": "cluster-id",
            "secret": "cluster-secret",
            "clusterName": "base",
            "controlPlane": {"endpoint": "https://base:6443"},
            "network": {
                "dnsDomain": "cluster.local",
                "podSubnets": ["10.244.0.0/16"],
                "serviceSubnets": ["10.96.0.0/12"],
            },
            "token": "inn7ol.u4ehnti8qyls9ymo",
            "secretboxEncryptionSecret": "c2VjcmV0",
            "ca": {"crt": "Y3J0", "key": "a2V5"},
            "aggregatorCA": {"crt": "Y3J0", "key": "a2V5"},
            "serviceAccount": {"key": "a2V5"},
            "apiServer": {"image": "kube-apiserver:v1", "certSANs": ["a"]},
            "controllerManager": {"image": "kube-controller-manager:v1"},
            "scheduler": {"image": "kube-scheduler:v1"},
            "etcd": {"image": "etcd:v1", "ca": {"crt": "Y3J0", "key": "a2V5"}},
        },
    }
    return [
        v1,
        typed("UnattendedInstallConfig", provisioning={"wipe": False}),
        typed("EnvironmentConfig", variables={"HTTP_PROXY": "http://proxy"}),
        typed("KernelModuleConfig", "br_netfilter", parameters=["a=1"]),
        typed("VolumeConfig", "EPHEMERAL", mount={"secure": True}, encryption={"keys": [{"slot": 0}]}),
        typed("HostnameConfig", auto="stable"),
        typed("KubeletConfig", image="kubelet:v1", clusterDNS=["10.96.0.10"]),
        typed("KubeAPIServerCAConfig", issuingCA={"cert": "c", "key": PEM}, acceptedCAs=["c"]),
        typed("KubeAggregatorCAConfig", issuingCA={"cert": "c", "key": PEM}),
        typed("KubeAPIServerConfig", image="kube-apiserver:v1", apiPort=6443),
        typed("KubeAuthenticationConfig", configuration={"anonymous": {"enabled": True}}),
        typed("KubeAdmissionControlConfig", "PodSecurity", configuration={"defaults": {"enforce": "baseline"}}),
        typed("KubeAuditPolicyConfig", configuration={"rules": [{"level": "Metadata"}]}),
        typed("KubeAuthorizerConfig", "rbac", type="RBAC"),
        typed("KubeControllerManagerConfig", image="kube-controller-manager:v1"),
        typed("KubeSchedulerConfig", image="kube-scheduler:v1"),
        typed("KubeNetworkConfig", dnsDomain="cluster.local", podSubnets=["10.244.0.0/16"]),
        typed("KubeServiceAccountConfig", issuer={"privateKey": PEM, "issuerURL": "https://base:6443"}),
        typed("KubeEtcdEncryptionConfig", config={"resources": [{"resources": ["secrets"]}]}),
        typed("KubeClusterConfig", clusterName="base", endpoint="https://base:6443"),
    ]


def _cm(node: Any) -> Any:
    if isinstance(node, dict):
        return CommentedMap((k, _cm(v)) for k, v in node.items())
    if isinstance(node, list):
        return [_cm(v) for v in node]
    return node


def config(docs: list[dict[str, Any]]) -> MachineConfig:
    # Built directly (parsing 250 configurations would cost seconds); parsed() goes through the parser.
    return MachineConfig([_cm(d) for d in copy.deepcopy(docs)])


def parsed(docs: list[dict[str, Any]]) -> MachineConfig:
    """JSON is YAML: the documents go through the same parser a node's configuration does."""
    return MachineConfig.parse("\n---\n".join(json.dumps(d) for d in docs))


def find(docs: list[dict[str, Any]], label: str) -> dict[str, Any]:
    for d in docs:
        if label == "v1alpha1" and "kind" not in d:
            return d
        if " ".join(str(d[k]) for k in ("kind", "name") if k in d) == label:
            return d
    raise KeyError(label)


def setter(label: str, path: tuple[str | int, ...], value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        node: Any = find(docs, label)
        for seg in path[:-1]:
            node = node.setdefault(seg, {}) if isinstance(seg, str) else node[seg]
        node[path[-1]] = value

    return mutate


@dataclass(frozen=True)
class Row:
    label: str  # the reported path
    mutate: Callable[[list[dict[str, Any]]], None]
    v113: Impact
    v114: Impact
    worker: Impact | None = None  # what a worker gets, when it differs


V1 = "v1alpha1"
ROWS = [
    Row(".debug", setter(V1, ("debug",), True), SAFE, SAFE),
    Row(".persist", setter(V1, ("persist",), False), REBOOT, SAFE),
    Row(".machine.token", setter(V1, ("machine", "token"), "new.token"), REBOOT, SAFE),
    Row(".machine.type", setter(V1, ("machine", "type"), "worker"), UNSUP, UNSUP),
    Row(".machine.type", setter(V1, ("machine", "type"), "init"), REBOOT, SAFE),  # same role, legacy name
    Row(".machine.kubelet.image", setter(V1, ("machine", "kubelet", "image"), "kubelet:v2"), SAFE, SAFE),
    Row(".machine.certSANs[0]", setter(V1, ("machine", "certSANs", 0), "b"), SAFE, SAFE),
    Row(".machine.network.hostname", setter(V1, ("machine", "network", "hostname"), "cp2"), SAFE, SAFE),
    Row(
        '.machine.sysctls["net.ipv4.ip_forward"]',
        setter(V1, ("machine", "sysctls", "net.ipv4.ip_forward"), "0"),
        SAFE,
        SAFE,
    ),
    Row(
        ".machine.features.diskQuotaSupport",
        setter(V1, ("machine", "features", "diskQuotaSupport"), False),
        REBOOT,
        SAFE,
    ),
    Row(".machine.features.kubePrism.port", setter(V1, ("machine", "features", "kubePrism", "port"), 7446), SAFE, SAFE),
    Row(".machine.udev.rules[0]", setter(V1, ("machine", "udev"), {"rules": ["x"]}), REBOOT, SAFE),
    Row(".machine.install.disk", setter(V1, ("machine", "install", "disk"), "/dev/vda"), INSTALL, INSTALL),
    Row(
        "UnattendedInstallConfig.provisioning.wipe",
        setter("UnattendedInstallConfig", ("provisioning", "wipe"), True),
        INSTALL,
        INSTALL,
    ),
    Row(".machine.env.HTTP_PROXY", setter(V1, ("machine", "env"), {"HTTP_PROXY": "x"}), REBOOT, REBOOT),
    Row(
        "EnvironmentConfig.variables.HTTP_PROXY",
        setter("EnvironmentConfig", ("variables", "HTTP_PROXY"), "y"),
        REBOOT,
        REBOOT,
    ),
    Row(
        ".machine.kernel.modules[0].name",
        setter(V1, ("machine", "kernel"), {"modules": [{"name": "br_netfilter"}]}),
        REBOOT,
        REBOOT,
    ),
    Row(
        "KernelModuleConfig br_netfilter.parameters[0]",
        setter("KernelModuleConfig br_netfilter", ("parameters", 0), "a=2"),
        REBOOT,
        REBOOT,
    ),
    Row(
        ".machine.systemDiskEncryption.state.provider",
        setter(V1, ("machine", "systemDiskEncryption"), {"state": {"provider": "luks2"}}),
        REBOOT,
        REBOOT,
    ),
    Row(
        "VolumeConfig EPHEMERAL.encryption.keys[0].slot",
        setter("VolumeConfig EPHEMERAL", ("encryption", "keys", 0, "slot"), 1),
        REBOOT,
        REBOOT,
    ),
    Row(
        "VolumeConfig EPHEMERAL.mount.secure", setter("VolumeConfig EPHEMERAL", ("mount", "secure"), False), SAFE, SAFE
    ),
    Row(".cluster.id", setter(V1, ("cluster", "id"), "other"), UNSUP, UNSUP, worker=UNSUP),
    Row(".cluster.secret", setter(V1, ("cluster", "secret"), "other"), UNSUP, UNSUP, worker=UNSUP),
    Row(".cluster.token", setter(V1, ("cluster", "token"), "abcdef.0123456789abcdef"), SAFE, SAFE),
    Row(".cluster.etcd.image", setter(V1, ("cluster", "etcd", "image"), "etcd:v2"), REBOOT, REBOOT, worker=SAFE),
    Row(".cluster.etcd.ca.crt", setter(V1, ("cluster", "etcd", "ca", "crt"), "bmV3"), REBOOT, REBOOT, worker=SAFE),
    # CA material. The Talos CA: apid reloads it. The Kubernetes and aggregator CAs restart kube-apiserver on a
    # control plane (issue 17: never applied to every control plane at once outside a rotation).
    Row(".machine.ca.crt", setter(V1, ("machine", "ca", "crt"), "bmV3"), SAFE, SAFE),
    Row(".machine.acceptedCAs[0].crt", setter(V1, ("machine", "acceptedCAs"), [{"crt": "bmV3"}]), SAFE, SAFE),
    Row(".cluster.ca.crt", setter(V1, ("cluster", "ca", "crt"), "bmV3"), API, API, worker=SAFE),
    Row(".cluster.acceptedCAs[0].crt", setter(V1, ("cluster", "acceptedCAs"), [{"crt": "bmV3"}]), API, API,
        worker=SAFE),
    Row(".cluster.aggregatorCA.crt", setter(V1, ("cluster", "aggregatorCA", "crt"), "bmV3"), API, API, worker=SAFE),
    Row(
        "KubeAPIServerCAConfig.acceptedCAs[1]",
        setter("KubeAPIServerCAConfig", ("acceptedCAs",), ["c", "d"]),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeAggregatorCAConfig.issuingCA.cert",
        setter("KubeAggregatorCAConfig", ("issuingCA", "cert"), "d"),
        API,
        API,
        worker=SAFE,
    ),
    # The APIServerRestart class (docs/decisions.md#apiserver-restart): a worker has no kube-apiserver.
    Row(
        ".cluster.apiServer.image",
        setter(V1, ("cluster", "apiServer", "image"), "kube-apiserver:v2"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        ".cluster.apiServer.certSANs[1]",
        setter(V1, ("cluster", "apiServer", "certSANs"), ["a", "b"]),
        API,
        API,
        worker=SAFE,
    ),
    Row("KubeAPIServerConfig.apiPort", setter("KubeAPIServerConfig", ("apiPort",), 5443), API, API, worker=SAFE),
    Row(
        "KubeAPIServerConfig.image",
        setter("KubeAPIServerConfig", ("image",), "kube-apiserver:v2"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeAuthenticationConfig.configuration.anonymous.enabled",
        setter("KubeAuthenticationConfig", ("configuration", "anonymous", "enabled"), False),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeAdmissionControlConfig PodSecurity.configuration.defaults.enforce",
        setter("KubeAdmissionControlConfig PodSecurity", ("configuration", "defaults", "enforce"), "restricted"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeAuditPolicyConfig.configuration.rules[0].level",
        setter("KubeAuditPolicyConfig", ("configuration", "rules", 0, "level"), "None"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeAuthorizerConfig rbac.type",
        setter("KubeAuthorizerConfig rbac", ("type",), "Webhook"),
        API,
        API,
        worker=SAFE,
    ),
    # Inputs of Talos's Kubernetes root secrets, which kube-apiserver loads.
    Row(
        ".cluster.network.dnsDomain",
        setter(V1, ("cluster", "network", "dnsDomain"), "example.com"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        ".cluster.network.serviceSubnets[0]",
        setter(V1, ("cluster", "network", "serviceSubnets", 0), "10.97.0.0/16"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        ".cluster.network.podSubnets[0]",
        setter(V1, ("cluster", "network", "podSubnets", 0), "10.245.0.0/16"),
        SAFE,
        SAFE,
    ),
    Row(
        ".cluster.controlPlane.endpoint",
        setter(V1, ("cluster", "controlPlane", "endpoint"), "https://x:6443"),
        API,
        API,
        worker=SAFE,
    ),
    Row(".cluster.clusterName", setter(V1, ("cluster", "clusterName"), "other"), API, API, worker=SAFE),
    Row(".cluster.serviceAccount.key", setter(V1, ("cluster", "serviceAccount", "key"), "bmV3"), API, API, worker=SAFE),
    Row(
        ".cluster.secretboxEncryptionSecret",
        setter(V1, ("cluster", "secretboxEncryptionSecret"), "bmV3"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeNetworkConfig.dnsDomain", setter("KubeNetworkConfig", ("dnsDomain",), "example.com"), API, API, worker=SAFE
    ),
    Row("KubeNetworkConfig.podSubnets[0]", setter("KubeNetworkConfig", ("podSubnets", 0), "10.245.0.0/16"), SAFE, SAFE),
    Row(
        "KubeServiceAccountConfig.issuer.issuerURL",
        setter("KubeServiceAccountConfig", ("issuer", "issuerURL"), "https://x:6443"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeEtcdEncryptionConfig.config.resources[0].resources[0]",
        setter("KubeEtcdEncryptionConfig", ("config", "resources", 0, "resources", 0), "configmaps"),
        API,
        API,
        worker=SAFE,
    ),
    Row(
        "KubeClusterConfig.endpoint",
        setter("KubeClusterConfig", ("endpoint",), "https://x:6443"),
        API,
        API,
        worker=SAFE,
    ),
    # Controller-manager and scheduler stay safe: leader-elected, the Kubernetes API stays up.
    Row(
        ".cluster.controllerManager.image", setter(V1, ("cluster", "controllerManager", "image"), "kcm:v2"), SAFE, SAFE
    ),
    Row(".cluster.scheduler.image", setter(V1, ("cluster", "scheduler", "image"), "ks:v2"), SAFE, SAFE),
    Row("KubeControllerManagerConfig.image", setter("KubeControllerManagerConfig", ("image",), "kcm:v2"), SAFE, SAFE),
    Row("KubeSchedulerConfig.image", setter("KubeSchedulerConfig", ("image",), "ks:v2"), SAFE, SAFE),
    Row("KubeletConfig.clusterDNS[0]", setter("KubeletConfig", ("clusterDNS", 0), "10.96.0.11"), SAFE, SAFE),
    Row("HostnameConfig.auto", setter("HostnameConfig", ("auto",), "off"), SAFE, SAFE),
]


def _row_cases() -> list[Any]:
    cases = []
    for i, row in enumerate(ROWS):
        for contract, expected in ((V1_13, row.v113), (V1_14, row.v114)):
            for role in ("controlplane", "worker"):
                want = row.worker if role == "worker" and row.worker is not None else expected
                if role == "worker" and row.worker is None and expected is API:
                    want = SAFE
                cases.append(pytest.param(row, contract, role, want, id=f"{i}-{row.label}-{contract}-{role}"))
    return cases


@pytest.mark.parametrize(("row", "contract", "role", "want"), _row_cases())
def test_table_row(row: Row, contract: VersionContract, role: str, want: Impact) -> None:
    old_docs = base_docs()
    new_docs = copy.deepcopy(old_docs)
    row.mutate(new_docs)
    result = classify(config(old_docs), config(new_docs), contract, role)
    assert [c.path for c in result.changes] == [row.label]
    (change,) = result.changes
    assert change.impact is want, change.reason
    assert change.reason


def test_every_table_ends_with_catch_all_rules() -> None:
    for contract, table in TABLES.items():
        assert table[-1].kinds is None and table[-1].prefix == (), contract
        assert table[-1].when is None and table[-1].worker_reason is None


def test_unknown_contract_and_role_are_refused() -> None:
    c = config(base_docs())
    with pytest.raises(UnsupportedContractError, match=r"v1\.13, v1\.14"):
        classify(c, c, VersionContract(1, 12), "controlplane")
    with pytest.raises(FieldmetaError, match="controlplane or worker"):
        classify(c, c, V1_14, "master")
    assert normalize_role("join") == "worker" and normalize_role("init") == "controlplane"


# ---- documents added or removed whole ------------------------------------------------------------


def _with(docs: list[dict[str, Any]], *extra: dict[str, Any]) -> MachineConfig:
    return config([*docs, *extra])


def _without(docs: list[dict[str, Any]], label: str) -> MachineConfig:
    target = find(docs, label)
    return config([d for d in docs if d is not target])


@pytest.mark.parametrize("contract", [V1_13, V1_14])
def test_whole_documents_are_one_change(contract: VersionContract) -> None:
    docs = base_docs()
    module = typed("KernelModuleConfig", "nf_conntrack", parameters=["hashsize=131072", "expect_hashsize=1024"])
    added = classify(config(docs), _with(docs, module), contract, "controlplane")
    assert [(c.path, c.impact) for c in added.changes] == [("KernelModuleConfig nf_conntrack (added)", REBOOT)]
    assert added.reboot_paths == ("KernelModuleConfig nf_conntrack (added)",)
    (change,) = added.changes
    assert change.change.op is Op.ADDED and change.change.whole_document
    # Classified by the fields it carries; never reported as them, nor as its header.
    assert change.change.leaves == (("parameters", 0), ("parameters", 1))

    removed = classify(config(docs), _without(docs, "KernelModuleConfig br_netfilter"), contract, "controlplane")
    assert [(c.path, c.impact) for c in removed.changes] == [("KernelModuleConfig br_netfilter (removed)", REBOOT)]

    install = classify(_without(docs, "UnattendedInstallConfig"), config(docs), contract, "worker")
    assert install.install_time_paths == ("UnattendedInstallConfig (added)",)
    assert install.worst is INSTALL


def test_added_document_is_classified_by_its_fields() -> None:
    docs = base_docs()
    plain = typed("VolumeConfig", "DATA", mount={"secure": True})
    encrypted = typed("VolumeConfig", "DATA", encryption={"provider": "luks2", "keys": [{"slot": 0}]})
    assert classify(config(docs), _with(docs, plain), V1_14, "controlplane").worst is SAFE
    result = classify(config(docs), _with(docs, encrypted), V1_14, "controlplane")
    assert result.reboot_paths == ("VolumeConfig DATA (added)",)
    assert "encryption keys" in result.changes[0].reason


def test_api_server_documents_added_depend_on_role() -> None:
    docs = base_docs()
    authz = typed("KubeAuthorizerConfig", "webhook", type="Webhook", webhook={"timeout": "3s"})
    cp = classify(config(docs), _with(docs, authz), V1_14, "controlplane")
    assert cp.api_server_restart_paths == ("KubeAuthorizerConfig webhook (added)",)
    assert cp.worst is API
    worker = classify(config(docs), _with(docs, authz), V1_14, "worker")
    assert worker.api_server_restart_paths == ()
    assert worker.safe_paths == ("KubeAuthorizerConfig webhook (added)",)
    assert "worker" in worker.changes[0].reason


@pytest.mark.parametrize("contract", [V1_13, V1_14])
def test_removing_the_v1alpha1_document_is_unsupported(contract: VersionContract) -> None:
    docs = base_docs()
    result = classify(config(docs), config(docs[1:]), contract, "controlplane")
    assert [c.path for c in result.changes] == ["v1alpha1 (removed)"]
    assert result.worst is UNSUP
    (unsupported,) = result.unsupported
    assert unsupported.path == "v1alpha1 (removed)" and "v1alpha1 document" in unsupported.reason
    back = classify(config(docs[1:]), config(docs), contract, "controlplane")
    assert back.worst is UNSUP and back.unsupported[0].path == "v1alpha1 (added)"


def test_discovery_identity_change_is_unsupported_but_a_layout_move_is_not() -> None:
    docs = base_docs()
    legacy_cluster = find(docs, "v1alpha1")["cluster"]
    moved = copy.deepcopy(docs)
    del find(moved, "v1alpha1")["cluster"]["id"], find(moved, "v1alpha1")["cluster"]["secret"]
    identity = typed("DiscoveryIdentityConfig", clusterID=legacy_cluster["id"], clusterSecret=legacy_cluster["secret"])
    same = classify(config(docs), _with(moved, identity), V1_14, "controlplane")
    assert {c.path: c.impact for c in same.changes} == {
        ".cluster.id": SAFE,
        ".cluster.secret": SAFE,
        "DiscoveryIdentityConfig (added)": SAFE,
    }
    other = typed("DiscoveryIdentityConfig", clusterID="another", clusterSecret=legacy_cluster["secret"])
    different = classify(config(docs), _with(moved, other), V1_14, "worker")
    assert different.worst is UNSUP
    assert {u.path for u in different.unsupported} == {
        ".cluster.id",
        ".cluster.secret",
        "DiscoveryIdentityConfig (added)",
    }
    changed = classify(_with(moved, identity), _with(moved, other), V1_14, "controlplane")
    assert [(u.path, "another cluster" in u.reason) for u in changed.unsupported] == [
        ("DiscoveryIdentityConfig.clusterID", True)
    ]


# ---- the diff itself --------------------------------------------------------------------------------


def test_list_elements_by_index() -> None:
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "v1alpha1")["machine"]["certSANs"] = ["z", "b", "c"]
    changes = diff(config(docs), config(new))
    assert [(c.label, c.op) for c in changes] == [
        (".machine.certSANs[0]", Op.MODIFIED),
        (".machine.certSANs[1]", Op.ADDED),
        (".machine.certSANs[2]", Op.ADDED),
    ]
    assert [(c.label, c.op) for c in diff(config(new), config(docs))][1:] == [
        (".machine.certSANs[1]", Op.REMOVED),
        (".machine.certSANs[2]", Op.REMOVED),
    ]


def test_subtrees_added_are_reported_by_leaf_and_empty_containers_are_leaves() -> None:
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "v1alpha1")["machine"]["kubelet"]["extraMounts"] = [{"source": "/var/x", "options": ["rshared"]}]
    find(new, "v1alpha1")["machine"]["kubelet"]["extraConfig"] = {}
    assert [c.label for c in diff(config(docs), config(new))] == [
        ".machine.kubelet.extraMounts[0].source",
        ".machine.kubelet.extraMounts[0].options[0]",
        ".machine.kubelet.extraConfig",
    ]


def test_no_change_for_equal_values_written_differently() -> None:
    a = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc\n  nodeLabels: null\n  mode: 0o644\n"
    b = 'version: v1alpha1\nmachine:\n  token: "abc"  # comment\n  type: |-\n    worker\n  mode: 420\n'
    assert diff(MachineConfig.parse(a), MachineConfig.parse(b)) == []
    # A YAML boolean is not the integer 1, although Python says True == 1.
    c = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc\n  mode: 1\n"
    d = "version: v1alpha1\nmachine:\n  type: worker\n  token: abc\n  mode: true\n"
    assert [ch.label for ch in diff(MachineConfig.parse(c), MachineConfig.parse(d))] == [".machine.mode"]


def test_order_is_stable_and_independent_of_the_old_document_order() -> None:
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "KubeletConfig")["image"] = "kubelet:v2"
    find(new, "v1alpha1")["cluster"]["etcd"]["image"] = "etcd:v2"
    find(new, "v1alpha1")["machine"]["token"] = "x"
    new.append(typed("SysctlConfig", params={"a": "b"}))
    new = [d for d in new if d.get("kind") != "HostnameConfig"]
    first = [c.label for c in diff(config(docs), config(new))]
    assert first == [
        ".machine.token",
        ".cluster.etcd.image",
        "KubeletConfig.image",
        "SysctlConfig (added)",
        "HostnameConfig (removed)",
    ]
    shuffled_old = [docs[0], *reversed(docs[1:])]
    assert [c.label for c in diff(parsed(shuffled_old), parsed(new))] == first
    result = classify(config(docs), config(new), V1_13, "controlplane")
    assert [c.path for c in result.changes] == first
    assert [c.path for c in classify(config(docs), config(new), V1_13, "controlplane").changes] == first
    # Reordering documents alone is no change.
    assert diff(config(docs), config(shuffled_old)) == []


def test_duplicate_documents_are_refused() -> None:
    docs = base_docs()
    with pytest.raises(ConfigDiffError, match="two KubeletConfig documents"):
        diff(config(docs), _with(docs, typed("KubeletConfig", image="x")))


def test_values_never_appear_in_paths_reasons_or_reprs() -> None:
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "KubeServiceAccountConfig")["issuer"]["privateKey"] = PEM.replace("MHc", "MHd")
    find(new, "v1alpha1")["cluster"]["secretboxEncryptionSecret"] = "dG9wLXNlY3JldA=="
    result = classify(config(docs), config(new), V1_14, "controlplane")
    assert result.api_server_restart_paths == (
        ".cluster.secretboxEncryptionSecret",
        "KubeServiceAccountConfig.issuer.privateKey",
    )
    text = repr(result) + " ".join(c.reason for c in result.changes)
    assert "BEGIN" not in text and "MHd" not in text and "dG9wLXNlY3JldA" not in text


# ---- the classification object and summaries -------------------------------------------------------


def test_classification_groups_and_worst() -> None:
    docs = base_docs()
    same = classify(config(docs), config(docs), V1_14, "controlplane")
    assert not same.has_changes and same.worst is SAFE and same.reboot_paths == ()
    new = copy.deepcopy(docs)
    find(new, "KubeletConfig")["image"] = "kubelet:v2"
    find(new, "KubeAPIServerConfig")["apiPort"] = 5443
    find(new, "v1alpha1")["machine"]["install"]["disk"] = "/dev/vdb"
    find(new, "EnvironmentConfig")["variables"]["NO_PROXY"] = "x"
    result = classify(config(docs), config(new), V1_14, "controlplane")
    assert result.worst is REBOOT
    assert result.reboot_paths == ("EnvironmentConfig.variables.NO_PROXY",)
    assert result.api_server_restart_paths == ("KubeAPIServerConfig.apiPort",)
    assert result.install_time_paths == (".machine.install.disk",)
    assert result.safe_paths == ("KubeletConfig.image",)
    assert result.unsupported == ()
    groups = result.by_impact
    assert list(groups) == list(Impact) and [c.path for c in groups[REBOOT]] == list(result.reboot_paths)
    assert sum(len(v) for v in groups.values()) == len(result.changes) == 4
    assert [i.rank for i in Impact] == sorted(i.rank for i in Impact)


def test_summarize_paths() -> None:
    paths = [f"p{i}" for i in range(8)]
    assert summarize_paths(paths) == "fields: p0, p1, p2, p3, p4, and 3 more"
    assert summarize_paths(paths[:5]) == "fields: p0, p1, p2, p3, p4"
    assert summarize_paths(paths[:2]) == "fields: p0, p1"
    assert summarize_paths(paths, limit=2) == "fields: p0, p1, and 6 more"
    assert (
        summarize_paths(("KernelModuleConfig br_netfilter (added)",))
        == "fields: KernelModuleConfig br_netfilter (added)"
    )
    assert summarize_paths([]) == "no fields"
    with pytest.raises(ValueError, match="at least 1"):
        summarize_paths(paths, limit=0)


# ---- CLI -------------------------------------------------------------------------------------------


def _render_parser() -> argparse.ArgumentParser:
    """``ichord render`` as the render CLI builds it: own options plus the ``diff`` sub-command."""
    parser = argparse.ArgumentParser(prog="ichord")
    commands = parser.add_subparsers(dest="command", required=True)
    render = commands.add_parser("render")
    render.add_argument("--talos-version", default="v1.14")
    render.add_argument("--role", default="controlplane")
    render.set_defaults(func=lambda _args: 99)
    add_diff_parser(render.add_subparsers(dest="render_command", required=False))
    return parser


def _run(argv: list[str]) -> int:
    args = _render_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc


def test_cli_diff_prints_classified_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "v1alpha1")["cluster"]["etcd"]["image"] = "etcd:v2"
    find(new, "v1alpha1")["machine"]["type"] = "worker"
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text(config(docs).to_yaml())
    new_file.write_text(config(new).to_yaml())
    assert (
        _run(["render", "diff", str(old_file), str(new_file), "--talos-version", "v1.13", "--role", "controlplane"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["unsupported", ".machine.type", *lines[0].split()[2:]]
    assert "reset it" in lines[0]
    assert lines[1].split() == ["reboot", ".cluster.etcd.image"]
    assert len(lines) == 2
    # Without --role the role is NEW's .machine.type: a worker runs no etcd.
    assert _run(["render", "diff", str(old_file), str(new_file), "--talos-version", "v1.14"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["safe", ".cluster.etcd.image"]
    assert _run(["render", "diff", str(old_file), str(old_file), "--talos-version", "v1.14"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no changes" in captured.err
    # The parent's own options and handler are untouched when diff is not asked for.
    assert _run(["render", "--talos-version", "v1.13"]) == 99


def test_cli_diff_bad_input(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(config(base_docs()).to_yaml())
    with pytest.raises(DiffInputError, match="cannot read"):
        _run(["render", "diff", str(tmp_path / "missing.yaml"), str(good), "--talos-version", "v1.14"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("machine: [unclosed\n")
    with pytest.raises(DiffInputError, match=r"bad\.yaml"):
        _run(["render", "diff", str(good), str(bad), "--talos-version", "v1.14"])
    typed_only = tmp_path / "typed.yaml"
    typed_only.write_text(json.dumps(typed("HostnameConfig", auto="stable")))
    with pytest.raises(DiffInputError, match="--role"):
        _run(["render", "diff", str(typed_only), str(typed_only), "--talos-version", "v1.14"])
    with pytest.raises(UnsupportedContractError):
        _run(["render", "diff", str(good), str(good), "--talos-version", "v1.9"])


def test_cli_diff_through_ichord_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ichord.cli import build_parser, main

    try:
        build_parser().parse_args(["render", "diff", "a", "b", "--talos-version", "v1.14"])
    except SystemExit:
        pytest.skip("`ichord render diff` is not hooked into ichord/render/cli.py yet")
    docs = base_docs()
    new = copy.deepcopy(docs)
    find(new, "KubeAPIServerConfig")["apiPort"] = 5443
    old_file, new_file = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old_file.write_text(config(docs).to_yaml())
    new_file.write_text(config(new).to_yaml())
    assert main(["render", "diff", str(old_file), str(new_file), "--talos-version", "v1.14"]) == 0
    assert capsys.readouterr().out.split() == ["api-server-restart", "KubeAPIServerConfig.apiPort"]
    assert main(["render", "diff", str(old_file), str(tmp_path / "nope.yaml"), "--talos-version", "v1.14"]) == 2


# ---- real configurations (upstream stability files) -------------------------------------------------


def _sample(talos_samples: Path, version: str, name: str) -> MachineConfig:
    return MachineConfig.parse((talos_samples / "stability" / version / f"{name}.yaml").read_bytes())


def test_stability_v1_14_base_to_overrides(talos_samples: Path) -> None:
    base = _sample(talos_samples, "v1.14", "base-controlplane")
    overrides = _sample(talos_samples, "v1.14", "overrides-controlplane")
    result = classify(base, overrides, V1_14, "controlplane")
    impacts = {c.path: c.impact for c in result.changes}
    assert impacts["UnattendedInstallConfig (added)"] is INSTALL
    assert impacts["KubeAPIServerConfig.apiPort"] is API
    assert impacts["KubeAPIServerConfig.certExtraSANs[0]"] is API
    assert impacts["RegistryMirrorConfig ghcr.io (added)"] is SAFE
    assert impacts["KubeFlannelCNIConfig (removed)"] is SAFE
    assert impacts[".machine.certSANs[1]"] is SAFE
    assert impacts['KubeNodeConfig.taints["node-role.kubernetes.io/control-plane"]'] is SAFE
    assert result.worst is API and result.reboot_paths == () and result.unsupported == ()
    # No path is ever a document's header or a whole document's field.
    assert not any(p.endswith(".apiVersion") or "(added)." in p for p in impacts)

    worker = classify(
        _sample(talos_samples, "v1.14", "base-worker"),
        _sample(talos_samples, "v1.14", "overrides-worker"),
        V1_14,
        "worker",
    )
    assert worker.api_server_restart_paths == () and worker.install_time_paths == ("UnattendedInstallConfig (added)",)


def test_stability_v1_13_base_to_overrides(talos_samples: Path) -> None:
    base = _sample(talos_samples, "v1.13", "base-controlplane")
    overrides = _sample(talos_samples, "v1.13", "overrides-controlplane")
    result = classify(base, overrides, V1_13, "controlplane")
    impacts = {c.path: c.impact for c in result.changes}
    assert impacts[".machine.install.disk"] is INSTALL
    assert impacts[".cluster.apiServer.certSANs[0]"] is API
    assert impacts[".machine.kubelet.extraMounts[0].source"] is SAFE
    assert impacts["RegistryMirrorConfig ghcr.io (added)"] is SAFE
    assert result.reboot_paths == () and result.unsupported == ()


def test_stability_role_change_and_contract_layout_move(talos_samples: Path) -> None:
    cp = _sample(talos_samples, "v1.14", "base-controlplane")
    worker = _sample(talos_samples, "v1.14", "base-worker")
    role_change = classify(cp, worker, V1_14, "worker")
    assert [u.path for u in role_change.unsupported] == [".machine.type"]
    # The same cluster rendered for v1.13 then v1.14: identity moves into DiscoveryIdentityConfig, no other cluster.
    legacy = _sample(talos_samples, "v1.13", "base-controlplane")
    moved = classify(legacy, cp, V1_14, "controlplane")
    assert moved.unsupported == () and moved.reboot_paths == ()
    assert {".cluster.id", "DiscoveryIdentityConfig (added)"} <= set(moved.safe_paths)
