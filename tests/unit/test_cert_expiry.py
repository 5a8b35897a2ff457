"""The pure parts of the CA expiry pass: status.certificates, CertificatesExpiring, the export rule."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from ichord.api.conditions import now_rfc3339
from ichord.api.names import BUNDLE_EXPORTED_ANNOTATION, CERTIFICATES_EXPIRING, CertificatesExpiringReason
from ichord.metrics import REGISTRY
from ichord.operations.bundle_source import public_bundle
from ichord.operations.cert_expiry import (
    backup_stale_lowered,
    expiry_status,
    forget_cluster,
    publish_metrics,
    wants_expiry_pass,
)
from ichord.pki.bundle import BundleError, SecretsBundle, generate_bundle
from ichord.pki.ca import CA_VALIDITY, CAKind, CertificateAuthority, generate_ca
from ichord.pki.fingerprint import bundle_fingerprint, ca_fingerprint, export_fingerprint
from ichord.settings import SettingsError

GEN = dt.datetime(2026, 1, 10, 8, 30, tzinfo=dt.UTC)
NOT_AFTER = GEN + CA_VALIDITY  # every CA of BUNDLE
METRIC = "ichord_certificate_expiry_timestamp_seconds"


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    # The RSA service-account key takes ~0.5 s: one bundle for the module.
    return generate_bundle(now=GEN)


def expiring_at(kind: CAKind, not_after: dt.datetime) -> dict[CAKind, CertificateAuthority]:
    return {kind: generate_ca(kind, now=not_after - CA_VALIDITY)}


def cluster_obj(annotation: str | None) -> dict[str, object]:
    meta: dict[str, object] = {"namespace": "ns", "name": "c1"}
    if annotation is not None:
        meta["annotations"] = {BUNDLE_EXPORTED_ANNOTATION: annotation}
    return {"metadata": meta, "spec": {"secretsRef": {"name": "c1-bundle"}}}


def test_status_certificates_name_every_ca_with_rfc3339_utc(bundle: SecretsBundle) -> None:
    result = expiry_status(bundle, GEN, 90)
    assert [c["name"] for c in result.status_certificates()] == [
        "talos", "kubernetes", "kubernetes-aggregator", "etcd"]
    by_name = {c["name"]: c for c in result.status_certificates()}
    assert by_name["talos"]["fingerprint"] == ca_fingerprint(bundle.os)
    assert by_name["etcd"]["fingerprint"] == ca_fingerprint(bundle.etcd)
    assert by_name["kubernetes-aggregator"]["fingerprint"] == ca_fingerprint(bundle.k8s_aggregator)
    for c in result.status_certificates():
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", c["notAfter"])
        assert c["notAfter"] == now_rfc3339(NOT_AFTER)


def test_outside_the_window_is_false_with_the_earliest_named(bundle: SecretsBundle) -> None:
    result = expiry_status(bundle, NOT_AFTER - dt.timedelta(days=91), 90)
    cond = result.condition
    assert (cond.type, cond.status, cond.reason) == (CERTIFICATES_EXPIRING, "False",
                                                      CertificatesExpiringReason.NOT_EXPIRING)
    assert "90-day" in cond.message and now_rfc3339(NOT_AFTER) in cond.message
    assert result.expiring == result.expired == ()


def test_inside_the_window_names_only_the_expiring_ca_and_its_utc_date(bundle: SecretsBundle) -> None:
    soon = GEN + dt.timedelta(days=400)
    b = bundle.with_cas(expiring_at(CAKind.KUBERNETES, soon))
    result = expiry_status(b, soon - dt.timedelta(days=30), 90)
    cond = result.condition
    assert (cond.status, cond.reason) == ("True", CertificatesExpiringReason.EXPIRING)
    assert f"kubernetes expires on {now_rfc3339(soon)}" in cond.message
    assert "`ichord cluster rotate NAME -n NS --targets kubernetes`" in cond.message
    for other in ("talos", "etcd", "kubernetes-aggregator"):
        assert f"{other} expire" not in cond.message
    assert [c.name for c in result.expiring] == ["kubernetes"]
    assert "days" not in cond.message.replace("-day warning", "")  # a date, never a count of days left


def test_window_edge_and_zero_window(bundle: SecretsBundle) -> None:
    assert expiry_status(bundle, NOT_AFTER - dt.timedelta(days=90), 90).condition.status == "True"
    assert expiry_status(bundle, NOT_AFTER - dt.timedelta(days=90, seconds=1), 90).condition.status == "False"
    assert expiry_status(bundle, NOT_AFTER - dt.timedelta(seconds=1), 0).condition.status == "False"
    with pytest.raises(SettingsError, match="0 or more"):
        expiry_status(bundle, GEN, -1)


def test_expired_and_expiring_cas_are_each_named(bundle: SecretsBundle) -> None:
    past = GEN + dt.timedelta(days=100)
    soon = GEN + dt.timedelta(days=150)
    b = bundle.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD, now=past - CA_VALIDITY),
                         CAKind.OS: generate_ca(CAKind.OS, now=soon - CA_VALIDITY)})
    result = expiry_status(b, GEN + dt.timedelta(days=120), 90)
    cond = result.condition
    assert (cond.status, cond.reason) == ("True", CertificatesExpiringReason.EXPIRED)
    assert f"etcd expired on {now_rfc3339(past)}" in cond.message
    assert f"talos expires on {now_rfc3339(soon)}" in cond.message
    assert "--targets talos,etcd`" in cond.message
    assert [c.name for c in result.expired] == ["etcd"]


def test_the_condition_is_stable_across_hours(bundle: SecretsBundle) -> None:
    soon = GEN + dt.timedelta(days=400)
    b = bundle.with_cas(expiring_at(CAKind.AGGREGATOR, soon))
    start = soon - dt.timedelta(days=60)
    conds = {expiry_status(b, start + dt.timedelta(hours=h), 90).condition for h in range(0, 24 * 7, 5)}
    assert len(conds) == 1
    quiet = {expiry_status(bundle, GEN + dt.timedelta(hours=h), 90).condition for h in range(0, 48)}
    assert len(quiet) == 1


def test_only_the_live_export_fingerprint_lowers_backup_stale(bundle: SecretsBundle) -> None:
    assert backup_stale_lowered(cluster_obj(export_fingerprint(bundle)), bundle)
    assert not backup_stale_lowered(cluster_obj(None), bundle)
    assert not backup_stale_lowered(cluster_obj(""), bundle)
    # The BundleFingerprint (talos + kubernetes only) is not the ExportFingerprint.
    assert not backup_stale_lowered(cluster_obj(bundle_fingerprint(bundle)), bundle)
    # An export of the pre-rotation bundle does not count, even after an etcd-only rotation.
    rotated = bundle.with_cas({CAKind.ETCD: generate_ca(CAKind.ETCD)})
    assert bundle_fingerprint(rotated) == bundle_fingerprint(bundle)
    assert not backup_stale_lowered(cluster_obj(export_fingerprint(bundle)), rotated)
    assert backup_stale_lowered(cluster_obj(export_fingerprint(rotated)), rotated)


def test_gauge_series_are_published_and_forgotten(bundle: SecretsBundle) -> None:
    result = expiry_status(bundle, GEN, 90)
    publish_metrics("unit-ns", "gone", result)
    publish_metrics("unit-ns", "kept", result)
    labels = {"namespace": "unit-ns", "name": "gone", "certificate": "etcd"}
    assert REGISTRY.get_sample_value(METRIC, labels) == NOT_AFTER.timestamp()
    forget_cluster("unit-ns", "gone")
    for cert in ("talos", "kubernetes", "kubernetes-aggregator", "etcd"):
        assert REGISTRY.get_sample_value(METRIC, {**labels, "certificate": cert}) is None
        assert REGISTRY.get_sample_value(METRIC, {**labels, "name": "kept", "certificate": cert}) is not None
    forget_cluster("unit-ns", "gone")  # idempotent
    forget_cluster("unit-ns", "kept")


def test_wants_a_pass_on_export_or_secret_change() -> None:
    base = cluster_obj("aa")
    assert wants_expiry_pass(None, base)
    assert not wants_expiry_pass(base, cluster_obj("aa"))
    assert wants_expiry_pass(base, cluster_obj("bb"))
    moved = cluster_obj("aa")
    moved["spec"] = {"secretsRef": {"name": "other"}}
    assert wants_expiry_pass(base, moved)


def test_the_public_view_holds_the_certificates_and_no_secret(bundle: SecretsBundle) -> None:
    raw = bundle.to_yaml().encode()
    view = public_bundle(raw)
    assert export_fingerprint(view) == export_fingerprint(bundle)
    assert expiry_status(view, GEN, 90) == expiry_status(bundle, GEN, 90)
    assert all(view.ca(k).key_pem is None for k in CAKind)
    assert (view.cluster_secret, view.cluster_id, view.bootstrap_token) == ("", "", "")
    assert view.k8s_service_account_key == b""
    assert public_bundle(raw) is view  # unchanged bytes are not parsed again
    with pytest.raises(BundleError, match=r"certs\.etcd\.crt is missing"):
        public_bundle(raw.replace(b"etcd:", b"etcdx:"))
