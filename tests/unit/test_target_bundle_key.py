"""Issue 29: a registered CA target whose CA is not one of Talos's four (``ca_kind`` a bundle key of its own) is kept
in the secrets bundle beside them, made with its description's profile, placed by the renderer through its render
writer, and rotated by the stage table like any other. The target is the integration tests' ``webhook``
(tests/integration/_fake_target.py), registered here by its one line for each test's span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ichord import yamlio
from ichord.api.carotation import Stage
from ichord.contract import V1_14
from ichord.operations.bundle_source import public_bundle
from ichord.operations.cert_expiry import certificate_expiries
from ichord.pki import targets as ca_targets
from ichord.pki.bundle import BundleError, SecretsBundle, generate_bundle
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation, Target, generate_rotation, parse_targets
from ichord.render.generate import render
from ichord.render.inputs import ClusterInputs, MachineInputs
from ichord.render.stages import render_stage
from tests.integration import _fake_target as fake

CLUSTER = ClusterInputs.from_spec("demo", {"endpoint": "https://demo:6443", "kubernetesVersion": "1.34.1",
                                           "talosVersion": str(V1_14)})


def _machine(role: str) -> MachineInputs:
    return MachineInputs.from_spec({"clusterRef": {"name": "demo"}, "role": role})


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    before = list(ca_targets.REGISTRY)
    ca_targets.register(fake.TARGET)  # the one registration line
    yield
    ca_targets.REGISTRY[:] = before


def _without_webhook(bundle: SecretsBundle) -> bytes:
    doc = yamlio.load(bundle.to_yaml())
    del doc["certs"][fake.NAME]
    return yamlio.dump(doc).encode()


def test_the_bundle_keeps_the_targets_ca_beside_talos_four() -> None:
    bundle = generate_bundle()
    ca = bundle.ca(fake.NAME)
    assert ca.certificate.subject.rfc4514_string() == "CN=webhook-ca"  # made with the description's profile
    again = SecretsBundle.from_yaml(bundle.to_yaml())
    assert again.ca(fake.NAME) == ca and again == bundle  # a round trip keeps it, key and all
    assert ca.key_pem is not None and ca.key_pem.decode() in bundle.secret_values()  # the scrubber knows its key
    assert public_bundle(bundle.to_yaml().encode()).ca(fake.NAME).key_pem is None  # the public view: certificate only


def test_a_bundle_made_before_the_target_parses_and_says_what_it_lacks() -> None:
    old = SecretsBundle.from_yaml(_without_webhook(generate_bundle()))
    assert not old.holds(fake.NAME)
    with pytest.raises(BundleError, match=r"certs\.webhook is missing"):
        old.ca(fake.NAME)
    # status.certificates publishes only what the bundle has; every other target as before.
    assert [c.name for c in certificate_expiries(old)] == ["talos", "kubernetes", "kubernetes-aggregator", "etcd"]
    assert [c.name for c in certificate_expiries(generate_bundle())] == [
        "talos", "kubernetes", "kubernetes-aggregator", fake.NAME, "etcd"]


def test_a_malformed_entry_is_refused_by_name() -> None:
    doc = yamlio.load(generate_bundle().to_yaml())
    doc["certs"][fake.NAME]["crt"] = "bm90IGEgY2VydA=="  # base64 of "not a cert"
    with pytest.raises(BundleError, match=r"certs\.webhook"):
        SecretsBundle.from_yaml(yamlio.dump(doc))


def test_rotation_yaml_and_the_stage_table_take_the_target() -> None:
    bundle = generate_bundle()
    assert parse_targets([fake.NAME]) == (Target(fake.NAME),)
    rotation = Rotation.from_yaml(generate_rotation((Target(fake.NAME),)).to_yaml())
    new = rotation.new[Target(fake.NAME)]
    old_fp, new_fp = ca_fingerprint(bundle.ca(fake.NAME)), ca_fingerprint(new)
    cp, worker = _machine("controlplane"), _machine("worker")

    def view(stage: Stage | None, machine: MachineInputs) -> dict[str, object]:
        config = render(bundle, CLUSTER, machine) if stage is None else render_stage(bundle, rotation, stage,
                                                                                     CLUSTER, machine)
        return fake.view_of(config.to_bytes())

    # The renderer places the bundle's CA; each stage signs and trusts as the table says; workers carry nothing.
    assert view(None, cp) == {"issuing": old_fp, "trusted": [old_fp]}
    assert view(Stage.ACCEPTING, cp) == {"issuing": old_fp, "trusted": [old_fp, new_fp]}
    assert view(Stage.ISSUING, cp) == {"issuing": new_fp, "trusted": [new_fp, old_fp]}
    assert view(Stage.DROPPING, cp) == {"issuing": new_fp, "trusted": [new_fp]}
    for stage in (None, Stage.ACCEPTING, Stage.ISSUING):
        assert view(stage, worker) == {"issuing": "", "trusted": []}
    # Dropping renders what a bundle already holding the new CA renders, byte for byte.
    assert render_stage(bundle, rotation, Stage.DROPPING, CLUSTER, cp).to_bytes() == \
        render(rotation.apply_to(bundle), CLUSTER, cp).to_bytes()
