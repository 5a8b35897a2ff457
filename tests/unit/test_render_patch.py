"""Config patches applied the way Talos's configpatcher applies them, and the typed refusals."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.render.config import MachineConfig
from ichord.render.errors import PatchError, RenderError
from ichord.render.generate import generate, render
from ichord.render.inputs import ClusterInputs, MachineInputs


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    # Contract 1.6 bundles have an EC service-account key: quick to generate, same shape otherwise.
    return generate_bundle(VersionContract(1, 6))


def cluster(contract: VersionContract = V1_14, *patches: str) -> ClusterInputs:
    return ClusterInputs(cluster_name="c", endpoint="https://c.example:6443", kubernetes_version="1.34.1",
                         contract=contract, patches=patches)


def rendered(bundle: SecretsBundle, *patches: str, contract: VersionContract = V1_14, role: str = "controlplane",
             machine_patches: tuple[str, ...] = ()) -> MachineConfig:
    return render(bundle, cluster(contract, *patches), MachineInputs(role=role, patches=machine_patches))  # type: ignore[arg-type]


# ---- strategic merge --------------------------------------------------------------------------


def test_partial_v1alpha1_merges_maps_and_appends_lists(bundle: SecretsBundle) -> None:
    patch = "machine:\n  certSANs: [a.example]\n  network:\n    hostname: n1\n"
    base = generate(bundle, cluster(V1_14), MachineInputs())
    cfg = rendered(bundle, patch, "machine:\n  certSANs: [b.example]\n")
    assert cfg.v1alpha1["machine"]["network"] == {"hostname": "n1"}
    assert cfg.v1alpha1["machine"]["certSANs"] == ["a.example", "b.example"]
    # Untouched keys stay, and stay in Talos's order (network sits before features).
    assert cfg.v1alpha1["machine"]["token"] == base.v1alpha1["machine"]["token"]
    assert list(cfg.v1alpha1["machine"]) == ["type", "token", "ca", "certSANs", "network", "features"]


def test_zero_values_do_not_override_but_false_does(bundle: SecretsBundle) -> None:
    cfg = rendered(bundle, 'machine:\n  token: ""\n  features:\n    diskQuotaSupport: false\n')
    assert cfg.v1alpha1["machine"]["token"] == bundle.trustd_token
    assert cfg.v1alpha1["machine"]["features"]["diskQuotaSupport"] is False


def test_typed_document_merges_into_its_match(bundle: SecretsBundle) -> None:
    cfg = rendered(bundle, "apiVersion: v1alpha1\nkind: KubeletConfig\nclusterDNS:\n  - 3.3.3.3\n")
    kubelet = cfg.find("KubeletConfig")
    assert kubelet is not None
    assert kubelet["clusterDNS"] == ["3.3.3.3"]
    assert list(kubelet) == ["apiVersion", "kind", "image", "config", "clusterDNS",
                             "defaultRuntimeSeccompProfileEnabled"]
    assert len(list(cfg.find_all("KubeletConfig"))) == 1


def test_talos_replaces_pod_and_service_subnets(bundle: SecretsBundle) -> None:
    patch = "apiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets: [10.10.0.0/16]\n"
    net = rendered(bundle, patch).find("KubeNetworkConfig")
    assert net is not None and net["podSubnets"] == ["10.10.0.0/16"]
    legacy = rendered(bundle, "cluster:\n  network:\n    serviceSubnets: [10.20.0.0/16]\n", contract=V1_13)
    assert legacy.v1alpha1["cluster"]["network"]["serviceSubnets"] == ["10.20.0.0/16"]


def test_named_documents_match_by_name_and_new_ones_are_appended(bundle: SecretsBundle) -> None:
    patch = (
        "apiVersion: v1alpha1\nkind: KernelModuleConfig\nname: br_netfilter\n---\n"
        "apiVersion: v1alpha1\nkind: KubeAuthorizerConfig\nname: rbac\ntype: RBAC\n"
    )
    cfg = rendered(bundle, patch)
    assert cfg.keys()[-1] == ("KernelModuleConfig", "br_netfilter")
    assert [k for k in cfg.keys() if k[0] == "KubeAuthorizerConfig"] == [  # noqa: SIM118 - a list
        ("KubeAuthorizerConfig", "node"), ("KubeAuthorizerConfig", "rbac")]


def test_interfaces_merge_by_interface_name(bundle: SecretsBundle) -> None:
    first = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        addresses: [10.0.0.2/24]\n"
    second = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 9000\n"
    ifaces = rendered(bundle, first, second).v1alpha1["machine"]["network"]["interfaces"]
    assert ifaces == [{"interface": "eth0", "addresses": ["10.0.0.2/24"], "mtu": 9000}]


def test_admission_plugins_merge_by_name(bundle: SecretsBundle) -> None:
    # Talos's AdmissionPluginConfigList.Merge (found by tests/real/test_render_oracle.py): a plugin
    # named again merges into the one there; ichord appended a second PodSecurity entry.
    patch = ("cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        configuration:\n"
             "          defaults:\n            enforce: privileged\n      - name: EventRateLimit\n"
             "        configuration: {}\n")
    plugins = rendered(bundle, patch, contract=V1_13).v1alpha1["cluster"]["apiServer"]["admissionControl"]
    assert [p["name"] for p in plugins] == ["PodSecurity", "EventRateLimit"]
    defaults = plugins[0]["configuration"]["defaults"]
    assert defaults["enforce"] == "privileged" and defaults["audit"] == "restricted"


@pytest.mark.parametrize("contract", [V1_13, V1_14])
def test_extra_args_values_replace_key_by_key(bundle: SecretsBundle, contract: VersionContract) -> None:
    # Talos's Args.Merge is maps.Copy: a value given again (string or list) replaces, never appends.
    def args(body: str) -> str:
        if contract == V1_13:
            return "machine:\n  kubelet:\n    extraArgs:\n" + body
        return "apiVersion: v1alpha1\nkind: KubeletConfig\nextraArgs:\n" + body.replace("      ", "  ")
    first = args("      feature-gates: [A=true, B=false]\n      max-pods: '250'\n")
    second = args("      feature-gates: [C=true]\n")
    cfg = rendered(bundle, first, second, contract=contract)
    doc = cfg.v1alpha1["machine"]["kubelet"] if contract == V1_13 else cfg.find("KubeletConfig")
    assert doc is not None
    assert doc["extraArgs"] == {"feature-gates": ["C=true"], "max-pods": "250"}
    third = args("      feature-gates: D=true\n")  # a list replaced by a string, not a shape conflict
    cfg = rendered(bundle, first, third, contract=contract)
    doc = cfg.v1alpha1["machine"]["kubelet"] if contract == V1_13 else cfg.find("KubeletConfig")
    assert doc is not None and doc["extraArgs"]["feature-gates"] == "D=true"


def test_delete_a_document(bundle: SecretsBundle) -> None:
    patch = "apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n"
    cfg = rendered(bundle, patch)
    assert cfg.find("KubeFlannelCNIConfig") is None
    # A cluster-wide delete of a control-plane document leaves workers (which lack it) alone.
    worker = rendered(bundle, patch, role="worker")
    assert worker.plain() == generate(bundle, cluster(V1_14), MachineInputs(role="worker")).plain()


def test_delete_a_key_and_a_list_element(bundle: SecretsBundle) -> None:
    patch = (
        "machine:\n  features:\n    diskQuotaSupport:\n      $patch: delete\n"
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n"
    )
    cfg = rendered(bundle, patch, contract=V1_13)
    assert "diskQuotaSupport" not in cfg.v1alpha1["machine"]["features"]
    assert "admissionControl" not in cfg.v1alpha1["cluster"]["apiServer"]
    assert "auditPolicy" in cfg.v1alpha1["cluster"]["apiServer"]


def test_delete_then_merge_in_one_document(bundle: SecretsBundle) -> None:
    setup = "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        mtu: 1400\n"
    patch = ("machine:\n  network:\n    interfaces:\n      - interface: eth0\n        $patch: delete\n"
             "      - interface: eth0\n        dhcp: true\n")
    ifaces = rendered(bundle, setup, patch).v1alpha1["machine"]["network"]["interfaces"]
    assert ifaces == [{"interface": "eth0", "dhcp": True}]


def test_deleting_an_unset_struct_field_is_a_no_op(bundle: SecretsBundle) -> None:
    # Talos zeroes the field (found by tests/real/test_render_oracle.py): a cluster-wide delete of
    # the control planes' nodeLabels applies to workers, which have none; ichord refused it.
    patch = "machine:\n  nodeLabels:\n    $patch: delete\n"
    assert "nodeLabels" not in rendered(bundle, patch, contract=V1_13).v1alpha1["machine"]
    worker = rendered(bundle, patch, contract=V1_13, role="worker")
    assert worker.plain() == generate(bundle, cluster(V1_13), MachineInputs(role="worker")).plain()
    typed = "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname:\n  $patch: delete\n"
    assert rendered(bundle, typed).plain() == generate(bundle, cluster(V1_14), MachineInputs()).plain()
    # A map key that is not there is still an error, as in Talos ("lookup failed").
    with pytest.raises(PatchError, match=r"deletes machine\.nodeLabels\.nope"):
        rendered(bundle, "machine:\n  nodeLabels:\n    nope:\n      $patch: delete\n", contract=V1_13)


def test_a_document_is_written_with_the_fields_talos_always_writes(bundle: SecretsBundle) -> None:
    # Talos encodes every document from its Go struct (found by tests/real/test_render_oracle.py at
    # v1.14): a field without omitempty appears zero-valued when a patch adds the document without
    # it or deletes it.
    added = rendered(bundle, "apiVersion: v1alpha1\nkind: KubeSchedulerConfig\nextraArgs:\n  v: '2'\n",
                     "apiVersion: v1alpha1\nkind: KubeServiceAccountConfig\naccepted:\n  audiences: [a]\n",
                     role="worker")
    assert added.find("KubeSchedulerConfig") == {"apiVersion": "v1alpha1", "kind": "KubeSchedulerConfig",
                                                 "image": "", "config": {}, "extraArgs": {"v": "2"}}
    account = added.find("KubeServiceAccountConfig")
    assert account is not None and list(account) == ["apiVersion", "kind", "issuer", "accepted"]
    assert account["issuer"] == {"privateKey": "", "issuerURL": ""}
    deleted = rendered(bundle, "apiVersion: v1alpha1\nkind: KubePrismConfig\nport:\n  $patch: delete\n",
                       "apiVersion: v1alpha1\nkind: KubeNetworkConfig\npodSubnets:\n  $patch: delete\n")
    assert deleted.find("KubePrismConfig") == {"apiVersion": "v1alpha1", "kind": "KubePrismConfig", "port": 0}
    network = deleted.find("KubeNetworkConfig")
    assert network is not None and list(network)[2:4] == ["dnsDomain", "podSubnets"] and network["podSubnets"] == []


def test_go_maps_and_free_form_objects_are_written_sorted(bundle: SecretsBundle) -> None:
    # Go's YAML encoder sorts map keys; a free-form object (meta.Unstructured) is maps all the way down.
    cfg = rendered(bundle, "apiVersion: v1alpha1\nkind: KubeNodeConfig\ntaints:\n  dedicated: infra:NoSchedule\n",
                   "apiVersion: v1alpha1\nkind: KubeletConfig\nconfig:\n  z: 1\n  a:\n    y: [{d: 1, c: 2}]\n"
                   "    b: 3\n")
    node, kubelet = cfg.find("KubeNodeConfig"), cfg.find("KubeletConfig")
    assert node is not None and list(node["taints"]) == ["dedicated", "node-role.kubernetes.io/control-plane"]
    assert kubelet is not None and list(kubelet["config"]) == ["a", "z"]
    assert list(kubelet["config"]["a"]) == ["b", "y"] and list(kubelet["config"]["a"]["y"][0]) == ["c", "d"]
    legacy = rendered(bundle, "machine:\n  kubelet:\n    extraConfig:\n      z: 1\n      a: 2\n", contract=V1_13)
    assert list(legacy.v1alpha1["machine"]["kubelet"]["extraConfig"]) == ["a", "z"]


def test_a_delete_in_a_document_that_is_not_there_appends_the_rest_of_it(bundle: SecretsBundle) -> None:
    # Talos applies a delete only to a document that is there, then appends the patch's document
    # (found by tests/real/test_render_oracle.py at v1.14); ichord refused the patch.
    gone = "apiVersion: v1alpha1\nkind: KubePrismConfig\n$patch: delete\n"
    cfg = rendered(bundle, gone, "apiVersion: v1alpha1\nkind: KubePrismConfig\nport:\n  $patch: delete\n")
    assert cfg.documents[-1] == {"apiVersion": "v1alpha1", "kind": "KubePrismConfig", "port": 0}
    worker = rendered(bundle, "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nextraArgs:\n  foo:\n"
                      "    $patch: delete\n  bar: baz\n", role="worker")
    assert worker.documents[-1] == {"apiVersion": "v1alpha1", "kind": "KubeAPIServerConfig", "image": "",
                                    "extraArgs": {"bar": "baz"}}


def test_a_merge_clears_the_cel_expressions_the_patch_leaves_unset(bundle: SecretsBundle) -> None:
    # cel.Expression's Merge takes the patch's value even when unset (found by
    # tests/real/test_render_oracle.py at v1.14): patching the install document drops its disk selector.
    c = ClusterInputs(cluster_name="c", endpoint="https://c.example:6443", kubernetes_version="1.34.1",
                      install_disk="/dev/sda",
                      patches=("apiVersion: v1alpha1\nkind: UnattendedInstallConfig\ninstaller:\n  image: i\n",))
    install = render(bundle, c, MachineInputs()).find("UnattendedInstallConfig")
    assert install is not None and install["provisioning"] == {"wipe": False}
    given = "apiVersion: v1alpha1\nkind: UnattendedInstallConfig\nprovisioning:\n  diskSelector:\n    match: 'true'\n"
    install = render(bundle, dataclasses.replace(c, patches=(given,)), MachineInputs()).find("UnattendedInstallConfig")
    assert install is not None and install["provisioning"] == {"diskSelector": {"match": "true"}, "wipe": False}


def test_deleting_what_is_not_there_is_an_error(bundle: SecretsBundle) -> None:
    with pytest.raises(PatchError, match=r"cluster patch 1: deletes machine\.network\.hostname"):
        rendered(bundle, "machine:\n  network:\n    hostname:\n      $patch: delete\n")
    with pytest.raises(PatchError, match="element with name: Nope"):
        rendered(bundle, "cluster:\n  apiServer:\n    admissionControl:\n      - name: Nope\n        $patch: delete\n",
                 contract=V1_13)


@pytest.mark.parametrize("patch", [
    "version: v1alpha1\n$patch: delete\n",
    "$patch: delete\n",
    '[{"op": "remove", "path": ""}]',
    '- op: replace\n  path: ""\n  value: {apiVersion: v1alpha1, kind: HostnameConfig}\n',
])
def test_removing_the_v1alpha1_document_is_refused(bundle: SecretsBundle, patch: str) -> None:
    with pytest.raises(PatchError, match="v1alpha1 document"):
        rendered(bundle, patch)


# ---- JSON6902 -----------------------------------------------------------------------------------


def test_json6902_add_replace_remove(bundle: SecretsBundle) -> None:
    ops = [
        {"op": "add", "path": "/machine/network", "value": {"hostname": "n1"}},
        {"op": "replace", "path": "/machine/features/diskQuotaSupport", "value": False},
        {"op": "add", "path": "/machine/certSANs/-", "value": "x.example"},
        {"op": "remove", "path": "/cluster/etcd"},
        {"op": "test", "path": "/machine/type", "value": "controlplane"},
    ]
    cfg = rendered(bundle, json.dumps(ops))
    m = cfg.v1alpha1["machine"]
    assert m["network"] == {"hostname": "n1"}
    assert m["features"]["diskQuotaSupport"] is False
    assert m["certSANs"] == ["x.example"]
    assert "etcd" not in cfg.v1alpha1["cluster"]
    # Typed documents are untouched by JSON patches.
    assert cfg.keys()[1:] == generate(bundle, cluster(V1_14), MachineInputs()).keys()[1:]


def test_json6902_yaml_form_and_failures(bundle: SecretsBundle) -> None:
    cfg = rendered(bundle, "- op: add\n  path: /machine/network\n  value:\n    hostname: y\n")
    assert cfg.v1alpha1["machine"]["network"]["hostname"] == "y"
    with pytest.raises(PatchError, match=r"operation 1 \(replace /machine/nope\)"):
        rendered(bundle, '[{"op": "replace", "path": "/machine/nope", "value": 1}]')
    with pytest.raises(PatchError, match="the value differs"):
        rendered(bundle, '[{"op": "test", "path": "/machine/type", "value": "worker"}]')
    with pytest.raises(PatchError, match="not a JSON6902 operation"):
        rendered(bundle, '[{"op": "frobnicate", "path": "/machine"}]')


# ---- invalid / conflicting patches -----------------------------------------------------------------


@pytest.mark.parametrize(("patch", "message"), [
    ("machine: [unclosed\n", "neither valid YAML nor JSON"),
    ("just a string\n", "not a mapping"),
    # Talos's decoder refuses these before any merge (render/strict.py).
    ("machine:\n  certSANs:\n    a: b\n", r"machine\.certSANs: expected a list \(\[\]string\), found a mapping"),
    ("machine:\n  type:\n    - worker\n", r"machine\.type: expected a string .*found a list"),
    ("kind: KubeletConfig\nimage: x\n", "needs both apiVersion and kind"),
    ("version: v1alpha2\nmachine: {}\n", "only v1alpha1 exists"),
    ("machine:\n  network:\n    $patch: replace\n", r"\$patch: 'replace'"),
    ("apiVersion: v1alpha1\nkind: KubeletConfig\n---\napiVersion: v1alpha1\nkind: KubeletConfig\n", "twice"),
    ("cluster:\n  apiServer:\n    admissionControl:\n      - configuration:\n          $patch: delete\n",
     "inner key of a list element"),
])
def test_invalid_patches_raise_typed_errors(bundle: SecretsBundle, patch: str, message: str) -> None:
    with pytest.raises(PatchError, match=message) as info:
        rendered(bundle, patch, contract=V1_13)
    assert info.value.patch == "cluster patch 1"


def test_legacy_ca_beside_the_multidoc_ca_document_is_refused(bundle: SecretsBundle) -> None:
    patch = "cluster:\n  ca:\n    crt: Zm9v\n    key: ''\n"
    with pytest.raises(RenderError, match=r"cluster\.ca in the v1alpha1 document conflicts with the KubeAPIServerCA"):
        rendered(bundle, patch)


def test_a_worker_never_gets_a_ca_key(bundle: SecretsBundle) -> None:
    worker = rendered(bundle, role="worker")
    assert worker.v1alpha1["machine"]["ca"]["key"] == ""
    for contract in (V1_13, V1_14):
        with pytest.raises(RenderError, match=r"machine\.ca\.key is set on a worker"):
            rendered(bundle, "machine:\n  ca:\n    key: Zm9v\n", contract=contract, role="worker")


def test_a_patch_must_not_change_the_machine_type(bundle: SecretsBundle) -> None:
    with pytest.raises(RenderError, match=r"must not change machine\.type"):
        rendered(bundle, "machine:\n  type: worker\n")


# ---- order ----------------------------------------------------------------------------------------


def test_cluster_patches_then_machine_patches(bundle: SecretsBundle) -> None:
    cfg = rendered(bundle, "machine:\n  network:\n    hostname: from-cluster\n",
                   machine_patches=("machine:\n  network:\n    hostname: from-machine\n",))
    assert cfg.v1alpha1["machine"]["network"]["hostname"] == "from-machine"
    # A machine JSON patch sees what the cluster patch added (it runs after it).
    cfg = rendered(bundle, "machine:\n  network:\n    hostname: a\n",
                   machine_patches=('[{"op": "test", "path": "/machine/network/hostname", "value": "a"}]',))
    assert cfg.v1alpha1["machine"]["network"]["hostname"] == "a"
    with pytest.raises(PatchError) as info:
        rendered(bundle, machine_patches=("machine: [",))
    assert info.value.patch == "machine patch 1"


def test_a_failed_patch_leaves_nothing_changed(bundle: SecretsBundle) -> None:
    inputs = cluster(V1_14, "machine:\n  network:\n    hostname: a\n", "machine:\n  certSANs: {a: b}\n")
    before = generate(bundle, inputs, MachineInputs()).to_bytes()
    with pytest.raises(PatchError):
        render(bundle, inputs, MachineInputs())
    assert generate(bundle, inputs, MachineInputs()).to_bytes() == before
