"""The fidelity bar: render() reproduces every stability file Talos generates (v1.13 and v1.14)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle
from ichord.render.config import MachineConfig
from ichord.render.generate import render
from ichord.render.inputs import MachineInputs
from tests.unit.render_cases import stability_inputs

CASES = [
    (contract, variant, role)
    for contract in (V1_13, V1_14)
    for variant in ("base", "overrides")
    for role in ("controlplane", "worker")
]


def _ids(case: tuple[VersionContract, str, str]) -> str:
    return f"{case[0]}/{case[1]}-{case[2]}"


@pytest.fixture
def stability_bundle(talos_samples: Path) -> SecretsBundle:
    return SecretsBundle.load(talos_samples / "stability" / "secrets.yaml")


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_render_equals_talos_stability_file(
    case: tuple[VersionContract, str, str], talos_samples: Path, stability_bundle: SecretsBundle
) -> None:
    contract, variant, role = case
    expected = MachineConfig.parse((talos_samples / "stability" / str(contract) / f"{variant}-{role}.yaml").read_text())
    got = render(stability_bundle, stability_inputs(contract, variant, talos_samples), MachineInputs(role=role))

    assert got.keys() == expected.keys(), "documents (kind, name) and their order"
    for exp_doc, got_doc in zip(expected.plain(), got.plain(), strict=True):
        assert got_doc == exp_doc
    # Key order too: Talos's struct order, so our encoding reads (and hashes) like the node's.
    assert got.to_yaml() == expected.to_yaml()


def test_stability_bundle_has_an_ec_service_account_key(talos_samples: Path, stability_bundle: SecretsBundle) -> None:
    # Talos puts whatever service-account key the bundle holds; the stability bundle's is EC.
    got = render(stability_bundle, stability_inputs(V1_14, "base"), MachineInputs())
    sa = got.find("KubeServiceAccountConfig")
    assert sa is not None
    assert sa["issuer"]["privateKey"].startswith("-----BEGIN EC PRIVATE KEY-----\n")
    assert sa["issuer"]["privateKey"] == stability_bundle.k8s_service_account_key.decode()


@pytest.mark.parametrize("contract", [V1_13, V1_14], ids=str)
def test_render_is_deterministic_and_reparses_to_the_same_hash(
    contract: VersionContract, stability_bundle: SecretsBundle, talos_samples: Path
) -> None:
    for role in ("controlplane", "worker"):
        inputs = stability_inputs(contract, "overrides", talos_samples)
        first = render(stability_bundle, inputs, MachineInputs(role=role))
        second = render(stability_bundle, inputs, MachineInputs(role=role))
        assert first.to_bytes() == second.to_bytes()
        assert first.hash() == second.hash()
        reparsed = MachineConfig.parse(first.to_bytes())
        assert reparsed.hash() == first.hash()
        assert reparsed.plain() == first.plain()


def test_quoted_patch_values_reparse_to_the_same_hash(stability_bundle: SecretsBundle) -> None:
    patches = (
        'machine:\n  network:\n    hostname: "n1"\n  nodeLabels:\n    "a/b": \'\'\n  sysctls: {"x": 0x10}\n',
        '[{"op": "add", "path": "/machine/env", "value": {"A": "1"}}]',
        'apiVersion: v1alpha1\nkind: KubeletConfig\nclusterDNS: ["3.3.3.3"]\n',
    )
    inputs = stability_inputs(V1_14, "base")
    config = render(stability_bundle, dataclasses.replace(inputs, patches=patches), MachineInputs())
    assert config.v1alpha1["machine"]["env"] == {"A": "1"}
    assert MachineConfig.parse(config.to_bytes()).hash() == config.hash()
    assert MachineConfig.parse(config.to_bytes()).to_bytes() == config.to_bytes()  # the encoding too


def test_multidoc_pem_is_a_literal_block_and_legacy_pem_is_base64(stability_bundle: SecretsBundle) -> None:
    v14 = render(stability_bundle, stability_inputs(V1_14, "base"), MachineInputs()).to_yaml()
    assert "    cert: |\n        -----BEGIN CERTIFICATE-----\n" in v14
    v13 = render(stability_bundle, stability_inputs(V1_13, "base"), MachineInputs()).to_yaml()
    assert "-----BEGIN" not in v13
