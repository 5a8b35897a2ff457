"""Issue 29: a CA target is one description (ichord/pki/targets). The CRDs' enums agree with the registry, the
orders come from it, and the pure readers pick up a target that only a description (here a fake, in this test)
adds."""

from __future__ import annotations

import datetime as dt
import importlib
import pkgutil
from dataclasses import replace
from typing import Any

import pytest

from ichord import yamlio
from ichord.api.abandonable import ca_rotation_abandonable, rotation_abandonable
from ichord.api.views import OperationView
from ichord.operations.cert_expiry import certificate_expiries
from ichord.pki import targets as ca_targets
from ichord.pki.bundle import generate_bundle
from ichord.pki.ca import CAKind
from ichord.pki.rotation import DEFAULT_TARGETS, TARGET_ORDER, Target
from ichord.pki.targets import (
    REGISTRY,
    TargetDescription,
    certificate_names,
    default_target_names,
    target_names,
)
from tests.unit.test_kube_crds import CRD_DIR

FAKE = TargetDescription(
    name="fake", ca_kind=CAKind.OS, rotation_key="fake", expiry_rank=15,
    default=True, control_plane_only=True, restarts_apiserver=False, reboot_roll=False, hands_off=False,
    issuing_is_point_of_no_return=True)


def _schema(file: str) -> dict[str, Any]:
    doc = yamlio.load((CRD_DIR / file).read_text())
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# ---- the registry --------------------------------------------------------------------------------------------


def test_every_module_of_the_package_is_registered_once() -> None:
    modules = {m.name for m in pkgutil.iter_modules(ca_targets.__path__)} - {"description"}
    described = {importlib.import_module(f"ichord.pki.targets.{m}").TARGET for m in modules}
    assert described == set(REGISTRY) and len(REGISTRY) == len(modules)
    for field in ("name", "ca_kind", "rotation_key", "expiry_rank"):
        values = [getattr(t, field) for t in REGISTRY]
        assert len(set(values)) == len(values), f"two targets share a {field}: {values}"


def test_the_enum_is_the_registry_in_one_order() -> None:
    assert [t.value for t in Target] == [t.value for t in TARGET_ORDER] == list(target_names())
    assert [t.value for t in DEFAULT_TARGETS] == list(default_target_names()) == ["talos", "kubernetes"]
    assert all(t.description.name == t.value for t in Target)


def test_the_orders() -> None:
    # The rotation order (spec enum, rotation.yaml, status.plan) and status.certificates' own, as the CRD shows it.
    assert target_names() == ("talos", "kubernetes", "etcd", "kubernetes-aggregator")
    assert certificate_names() == ("talos", "kubernetes", "kubernetes-aggregator", "etcd")


# ---- the CRDs against the registry ---------------------------------------------------------------------------


def test_talos_operation_targets_enum_is_the_registry() -> None:
    ca = _schema("talosoperations.yaml")["properties"]["spec"]["properties"]["caRotation"]["properties"]["targets"]
    assert ca["items"]["enum"] == list(target_names())
    defaults = ", ".join(default_target_names())
    assert f"absent means [{defaults}]" in " ".join(ca["description"].split())


def test_talos_cluster_renew_before_keys_are_the_registry() -> None:
    spec = _schema("talosclusters.yaml")["properties"]["spec"]["properties"]["caRotation"]["properties"]
    assert list(spec["renewBeforeByTarget"]["properties"]) == list(target_names())
    assert spec["renewBeforeByTarget"].get("additionalProperties") in (None, False)
    listed = " ".join(spec["renewBefore"]["description"].split())
    assert f"({', '.join(target_names())})" in listed


def test_talos_cluster_status_certificates_enum_is_the_expiry_order() -> None:
    certs = _schema("talosclusters.yaml")["properties"]["status"]["properties"]["certificates"]
    assert certs["items"]["properties"]["name"]["enum"] == list(certificate_names())


# ---- a fake target, added by a description alone ---------------------------------------------------------------


@pytest.fixture
def fake_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ca_targets, "REGISTRY", (*REGISTRY, FAKE))  # the one registration line


def test_a_fake_target_is_a_default_and_placed_in_the_expiry_order(fake_registered: None) -> None:
    assert default_target_names() == ("talos", "kubernetes", "fake")
    assert target_names()[-1] == "fake"
    assert certificate_names() == ("talos", "kubernetes", "fake", "kubernetes-aggregator", "etcd")


def test_a_fake_target_decides_abandon(fake_registered: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert rotation_abandonable("Accepting", ["fake"])
    assert not rotation_abandonable("Issuing", ["fake"])  # its Issuing is its point of no return
    assert rotation_abandonable("Issuing", ["talos", "kubernetes-aggregator"])
    # Absent targets mean the defaults, the fake among them.
    op = OperationView.of({"metadata": {"name": "r", "namespace": "ns", "uid": "r"},
                           "spec": {"kind": "ca-rotation", "clusterRef": {"name": "c"}},
                           "status": {"caRotation": {"stage": "Issuing"}}})
    assert op.stage == "Issuing"
    assert not ca_rotation_abandonable(op)
    no_return = replace(FAKE, issuing_is_point_of_no_return=False, default=False)
    monkeypatch.setattr(ca_targets, "REGISTRY", (*REGISTRY, no_return))
    assert rotation_abandonable("Issuing", ["fake"])


def test_a_fake_target_is_published_in_status_certificates(fake_registered: None) -> None:
    bundle = generate_bundle(now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    certs = certificate_expiries(bundle)
    assert [c.name for c in certs] == ["talos", "kubernetes", "fake", "kubernetes-aggregator", "etcd"]
    assert certs[2].fingerprint == certs[0].fingerprint  # the fake reads the OS CA of the bundle
