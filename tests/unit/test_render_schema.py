"""Every document render() produces validates against Talos's config.schema.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.contract import V1_13, V1_14, VersionContract
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from tests.unit.render_cases import stability_inputs
from tests.unit.render_schema import schema_errors


@pytest.fixture(scope="module")
def fresh_bundle() -> SecretsBundle:
    return generate_bundle(V1_14)  # RSA-4096 service-account key, as talosctl gen secrets makes it


@pytest.mark.parametrize("contract", [V1_13, V1_14], ids=str)
@pytest.mark.parametrize("variant", ["base", "overrides"])
@pytest.mark.parametrize("role", ["controlplane", "worker"])
@pytest.mark.parametrize("bundle_kind", ["stability", "fresh"])
def test_rendered_documents_validate(
    contract: VersionContract, variant: str, role: str, bundle_kind: str, talos_samples: Path,
    fresh_bundle: SecretsBundle,
) -> None:
    bundle = (SecretsBundle.load(talos_samples / "stability" / "secrets.yaml")
              if bundle_kind == "stability" else fresh_bundle)
    config = render(bundle, stability_inputs(contract, variant, talos_samples), MachineInputs(role=role))
    assert schema_errors(talos_samples / "config.schema.json", config.plain()) == []


@pytest.mark.parametrize("contract", [V1_13, V1_14], ids=str)
@pytest.mark.parametrize("preset", ["cilium", "unmanaged"])
def test_cni_presets_and_hostname_validate(
    contract: VersionContract, preset: str, talos_samples: Path, fresh_bundle: SecretsBundle
) -> None:
    spec = {"endpoint": "https://c.example:6443", "kubernetesVersion": "1.34.1", "talosVersion": str(contract),
            "cni": {"preset": preset}, "registryMirrors": {"docker.io": ["https://a.example", "http://b.example"]}}
    cluster = ClusterInputs.from_spec("c", spec)
    for role in ("controlplane", "worker"):
        config = render(fresh_bundle, cluster, MachineInputs(role=role, hostname="node-1"))
        assert schema_errors(talos_samples / "config.schema.json", config.plain()) == []


def test_validator_catches_a_bad_document(talos_samples: Path) -> None:
    # The helper must be able to fail: a typo'd key and a wrong type are both reported.
    bad = [{"apiVersion": "v1alpha1", "kind": "KubePrismConfig", "port": "7445", "prt": 1}]
    errors = schema_errors(talos_samples / "config.schema.json", bad)
    assert len(errors) >= 2
    assert schema_errors(talos_samples / "config.schema.json", [{"apiVersion": "v1alpha1", "kind": "Nope"}])
