"""render/strict.py: Talos's decoder rules from the generated schemas, their messages and the text grammars."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from ichord.api.carotation import Stage
from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.rotation import Target, generate_rotation
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage
from ichord.render.strict import (
    _CONTENT,
    STRING_PROBES,
    InvalidConfigError,
    check_document,
    probe_class,
    schema_for,
)

CONTRACTS = [V1_13, V1_14]


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


def _cluster(contract: VersionContract, *patches: str) -> ClusterInputs:
    return ClusterInputs(cluster_name="c", endpoint="https://c.example:6443", kubernetes_version="1.34.1",
                         contract=contract, patches=patches)


@pytest.mark.parametrize("contract", CONTRACTS, ids=str)
@pytest.mark.parametrize("role", ["controlplane", "worker"])
def test_every_document_ichord_renders_is_in_the_schema_and_decodes(bundle: SecretsBundle, contract: VersionContract,
                                                                    role: str) -> None:
    """Every stage of every target too: what ichord writes itself must never be refused."""
    cluster = _cluster(contract)
    machine = MachineInputs.from_spec({"role": role, "address": "10.0.0.2", "hostname": "n1"})
    config = render(bundle, cluster, machine)
    schema = schema_for(contract)
    for doc in config.documents:
        kind = doc.get("kind", "v1alpha1")
        assert kind in schema.documents, kind
        check_document(doc, contract)
    targets = [Target.TALOS, Target.KUBERNETES, Target.ETCD] + \
        ([Target.KUBERNETES_AGGREGATOR] if contract.multidoc_kubernetes else [])
    rotation = generate_rotation(tuple(targets))
    for stage in (Stage.ACCEPTING, Stage.ISSUING, Stage.DROPPING, Stage.FINALIZING):
        for doc in render_stage(bundle, rotation, stage, cluster, machine).documents:
            check_document(doc, contract)


@pytest.mark.parametrize(("contract", "patch", "document", "path", "detail"), [
    (V1_14, "machine:\n  env: just-a-string\n", "the v1alpha1 document", "machine.env",
     "expected a mapping (map[string]string), found a string ('just-a-string')"),
    (V1_13, "machine:\n  nonsense: 1\n", "the v1alpha1 document", "machine.nonsense", "unknown field"),
    (V1_14, "machine:\n  install:\n    wipe: maybe\n", "the v1alpha1 document", "machine.install.wipe",
     "expected a boolean, true or false (bool), found a string ('maybe')"),
    (V1_14, "apiVersion: v1alpha1\nkind: KubeletConfig\nextraArgs: x\n", "document KubeletConfig (apiVersion v1alpha1)",
     "extraArgs", "expected a mapping"),
    (V1_13, "apiVersion: v1alpha1\nkind: KubeletConfig\nimage: x\n", "document KubeletConfig (apiVersion v1alpha1)",
     "kind", "Talos v1.13 knows no document kind 'KubeletConfig'"),
    (V1_14, "apiVersion: v1alpha2\nkind: HostnameConfig\nhostname: x\n",
     "document HostnameConfig (apiVersion v1alpha2)", "apiVersion", "expected v1alpha1"),
    (V1_14, "apiVersion: v1alpha1\nkind: HostnameConfig\nauto: sometimes\n",
     "document HostnameConfig (apiVersion v1alpha1)", "auto", "expected one of off, talos-addr, stable"),
    (V1_14, "machine:\n  time:\n    bootTimeout: 5\n", "the v1alpha1 document", "machine.time.bootTimeout",
     "expected a duration such as 30s or 5m (time.Duration), found an integer (5)"),
    (V1_14, "machine:\n  network:\n    kubespan:\n      mtu: 5000000000\n", "the v1alpha1 document",
     "machine.network.kubespan.mtu", "expected an integer (uint32), found an integer (5000000000)"),
    (V1_14, "machine:\n  network:\n    kubespan:\n      mtu: -1\n", "the v1alpha1 document",
     "machine.network.kubespan.mtu", "expected an integer (uint32), found an integer (-1)"),
    (V1_13, "machine:\n  kubelet:\n    extraArgs:\n      a: {b: c}\n", "the v1alpha1 document",
     "machine.kubelet.extraArgs.a", "expected a string or a list (v1alpha1.ArgValue), found a mapping"),
    (V1_14, "machine:\n  ca:\n    crt: eA==\n    key: eQ==\n    extra: z\n", "the v1alpha1 document",
     "machine.ca.extra", "unknown field"),
    # crypto's PEM types read crt and key as base64 text, whatever the Go field's type ([]byte).
    (V1_14, "machine:\n  ca:\n    crt: x\n", "the v1alpha1 document", "machine.ca.crt",
     "expected base64 text (x509.PEMEncodedCertificateAndKey), found a string ('x')"),
    (V1_13, "cluster:\n  acceptedCAs:\n    - crt: -1\n", "the v1alpha1 document", "cluster.acceptedCAs[0].crt",
     "expected base64 text (x509.PEMEncodedCertificate), found an integer (-1)"),
    (V1_14, "machine:\n  acceptedCAs:\n    - crt: [AAAA]\n", "the v1alpha1 document", "machine.acceptedCAs[0].crt",
     "expected base64 text (x509.PEMEncodedCertificate), found a list"),
    # cluster.inlineManifests (its own unmarshaler) is a list of mappings, each checked as ClusterInlineManifest.
    (V1_14, "cluster:\n  inlineManifests:\n    - name: a\n      contents: x\n      extra: 1\n",
     "the v1alpha1 document", "cluster.inlineManifests[0].extra", "unknown field"),
    (V1_13, "cluster:\n  inlineManifests:\n    - name: a\n      contents: {a: b}\n", "the v1alpha1 document",
     "cluster.inlineManifests[0].contents", "found a mapping"),
    (V1_14, "cluster:\n  inlineManifests:\n    name: a\n", "the v1alpha1 document", "cluster.inlineManifests",
     "found a mapping"),
])
def test_refusals_name_the_document_the_field_and_the_expected_type(
        bundle: SecretsBundle, contract: VersionContract, patch: str, document: str, path: str, detail: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        render(bundle, _cluster(contract, patch), MachineInputs.from_spec({"role": "controlplane"}))
    assert (err.value.patch, err.value.document, err.value.path) == ("cluster patch 1", document, path)
    assert detail in err.value.detail, err.value.detail
    assert "Talos's configuration decoder refuses it" in str(err.value)


@pytest.mark.parametrize("contract", CONTRACTS, ids=str)
def test_what_talos_takes_is_not_refused(bundle: SecretsBundle, contract: VersionContract) -> None:
    """go-yaml's own leniencies: any scalar into a string, YAML 1.1 booleans into a bool, sizes, addresses."""
    patch = ("machine:\n  install:\n    disk: 5\n    wipe: 'yes'\n  env: {A: '1'}\n  time:\n    bootTimeout: 1h30m\n"
             "  kubelet:\n    extraArgs:\n      feature-gates: [A=true, B=false]\n  network:\n    interfaces:\n"
             "      - interface: eth0\n        mtu: 9000\n        addresses: [10.0.0.2/24]\n"
             "  disks:\n    - device: /dev/sdb\n      partitions:\n        - mountpoint: /var/x\n"
             "          size: 10 GB\n"
             "  acceptedCAs: [{crt: ''}, {crt: true}, {}]\n"
             "cluster:\n  inlineManifests:\n    - name: ns\n      contents: |\n        apiVersion: v1\n"
             "        kind: Namespace\n        metadata: {name: ns}\n    - {name: empty}\n    - {}\n")
    render(bundle, _cluster(contract, patch), MachineInputs.from_spec({"role": "worker"}))


@pytest.mark.parametrize("contract", CONTRACTS, ids=str)
def test_a_pem_key_takes_base64_or_the_redaction_marker(contract: VersionContract) -> None:
    """crypto's PEMEncodedKey keeps x509.Redacted as it is (talosctl's redacted output reads back)."""
    for key in ("eQ==", "******", ""):
        check_document({"machine": {"ca": {"crt": "eA==", "key": key}}}, contract)
    with pytest.raises(InvalidConfigError) as err:
        check_document({"machine": {"ca": {"crt": "eA==", "key": "***"}}}, contract)
    assert err.value.path == "machine.ca.key"


@pytest.mark.parametrize(("value", "cls"), [
    (None, "null"), (True, "bool"), (0, "zero"), (7, "int"), (-2, "negint"), (1.5, "float"), (2.0, "floatint"),
    ({}, "emptymap"), ({"a": 1}, "map"), ([], "emptyseq"), ([1], "seq"), ([{}], "seqmap"), ([{"a": 1}], "seqmap"),
    ("", "s_empty"), ("on", "s_yes"),
    ("False", "s_true"), ("12", "s_int"), ("90s", "s_dur"), ("10.0.0.0/8", "s_cidr"), ("fd00::1", "s_ip"),
    ("https://x", "s_url"), ("abc", "s_word"),
])
def test_probe_classes(value: Any, cls: str) -> None:
    assert probe_class(value) == cls


@pytest.mark.parametrize(("go", "good", "bad"), [
    ("v1alpha1.DiskSize", ["10GB", "1.5 GiB", "100", "3k"], ["x", "10 GBs", "-5GB", " 10GB"]),
    ("block.ByteSize", ["", "-1GiB", "512MiB"], ["ten", "1 parsec"]),
    ("v1alpha1.InstallDiskSizeMatcher", [">= 10GB", "<1TB", "== 4GiB", "8GB"], [">> 1GB", "big"]),
    ("netip.Addr", ["10.0.0.1", "fd00::1", ""], ["10.0.0", "1.2.3.4/8", "fe80::1%eth0", "x"]),
    ("netip.Prefix", ["10.0.0.0/8", "10.0.0.1/32", "::/0"], ["10.0.0.0/33", "10.0.0.0", "10.0.0.0/08", "a/8"]),
    ("netip.AddrPort", ["1.2.3.4:80", "[::1]:6443"], ["1.2.3.4", "::1:80", "1.2.3.4:70000"]),
    ("nethelpers.HardwareAddr", ["00:11:22:33:44:55", ""], ["00:11:22:33:44", "zz:11:22:33:44:55"]),
    ("v1alpha1.Base64Bytes", ["aGVsbG8=", ""], ["not base64!", "aGVsbG8"]),
])
def test_text_grammars_take_what_talos_takes_and_no_more(go: str, good: list[str], bad: list[str]) -> None:
    grammar = _CONTENT[go]
    assert [g for g in good if not grammar(g)] == []
    assert [b for b in bad if grammar(b)] == []


def test_every_grammar_names_a_type_of_a_schema_and_every_parsed_text_type_has_one() -> None:
    """A renamed or new Go type in a new pin must not silently change what is checked."""
    seen: set[str] = set()
    for contract in CONTRACTS:
        data = json.loads(resources.files("ichord.render").joinpath("schema").joinpath(
            f"v{contract.major}.{contract.minor}.json").read_text())
        for t in data["types"].values():
            seen.add(t["go"])
            takes = set(t["accepts"]) & STRING_PROBES
            if t.get("custom") and not t.get("enum") and takes and takes != STRING_PROBES:
                # Some text but not all: its parser's grammar must be written down, not guessed from probes.
                assert t["go"] in _CONTENT, t["go"]
    assert set(_CONTENT) <= seen | {"network.Addr", "network.Prefix", "network.AddrPort", "meta.Addr",
                                    "meta.Prefix", "meta.AddrPort"}
