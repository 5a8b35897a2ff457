"""The trust pool: add, publish (no rewrite for nothing), load, clear, clear once the base trusts the newest."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from cryptography.hazmat.primitives import serialization

from ichord.metrics import REGISTRY
from ichord.operations.scope import TrustHooks
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca, issue_talos_client_certificate
from ichord.trust import SharedTrust
from ichord.trust.pool import TrustPool, TrustPoolError


@pytest.fixture(scope="module")
def cas() -> list[CertificateAuthority]:
    return [generate_ca(CAKind.KUBERNETES) for _ in range(3)]


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("ichord_trust_extra_cas")


def _reformatted(ca: CertificateAuthority) -> bytes:
    """The same certificate written differently (CRLF line ends): equality is by certificate, not bytes."""
    return ca.certificate.public_bytes(serialization.Encoding.PEM).replace(b"\n", b"\r\n")


def test_add_keeps_order_skips_duplicates_and_counts(cas: list[CertificateAuthority]) -> None:
    pool = TrustPool()
    assert pool.add(cas[0].cert_pem) is True
    assert pool.add(cas[1].cert_pem) is True
    assert pool.add(cas[0].cert_pem) is False
    assert pool.add(_reformatted(cas[1])) is False  # the same certificate, other bytes
    assert pool.extras == [cas[0].cert_pem, cas[1].cert_pem]
    assert pool.newest == cas[1].certificate
    assert _gauge() == 2


def test_add_refuses_keys_and_garbage_without_echoing_them(cas: list[CertificateAuthority]) -> None:
    pool = TrustPool()
    key = cas[0].key_pem
    assert key is not None
    with pytest.raises(TrustPoolError) as err:
        pool.add(cas[0].cert_pem + key)
    body = key.decode().splitlines()[1]
    assert "not a CERTIFICATE" in str(err.value) and body not in str(err.value)
    with pytest.raises(TrustPoolError, match="no PEM certificate"):
        pool.add(b"hello")
    broken = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(TrustPoolError, match=r"not a valid X\.509"):
        pool.add(broken)
    leaf = issue_talos_client_certificate(cas[0], ["os:admin"]).cert_pem
    with pytest.raises(TrustPoolError, match="is not a CA certificate"):
        pool.add(cas[1].cert_pem + leaf)
    assert pool.extras == []  # nothing half-added


def test_source_rereads_the_base_every_time(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    base = tmp_path / "ca.crt"
    base.write_bytes(cas[0].cert_pem)
    pool = TrustPool(base)
    pool.add(cas[1].cert_pem)
    assert pool.source() == [cas[0].cert_pem, cas[1].cert_pem]
    base.write_bytes(cas[2].cert_pem)  # the kubelet refreshed the projected file
    assert pool.source() == [cas[2].cert_pem, cas[1].cert_pem]
    base.unlink()
    with structlog.testing.capture_logs() as logs:
        assert pool.source() == [cas[1].cert_pem]
        assert pool.source() == [cas[1].cert_pem]
    assert [e["event"] for e in logs].count("cannot read the base CA file; trusting the extra CAs only") == 1
    assert TrustPool().source() == []


def test_publish_writes_logs_subject_and_validity_and_does_not_rewrite_for_nothing(
        tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    path = tmp_path / "trust" / "kubernetes-ca.crt"
    pool = TrustPool()
    assert pool.publish(path) is False and not path.exists()  # nothing to publish
    pool.add(cas[0].cert_pem)
    with structlog.testing.capture_logs() as logs:
        assert pool.publish(path) is True
    assert path.read_bytes() == cas[0].cert_pem
    [line] = [e for e in logs if e["event"] == "trusting an extra Kubernetes CA"]
    assert set(line) == {"event", "log_level", "path", "subject", "not_before", "not_after"}
    assert line["subject"] == cas[0].certificate.subject.rfc4514_string()
    assert line["not_after"] == cas[0].certificate.not_valid_after_utc.isoformat()

    inode = path.stat().st_ino  # an atomic rewrite would be a new file
    pool.add(cas[0].cert_pem)
    with structlog.testing.capture_logs() as logs:
        assert pool.publish(path) is False
    assert path.stat().st_ino == inode and logs == []
    path.unlink()  # someone removed it: the next publish writes it again
    assert pool.publish(path) is True and path.read_bytes() == cas[0].cert_pem
    pool.add(cas[1].cert_pem)
    assert pool.publish(path) is True
    assert path.read_bytes() == cas[0].cert_pem + cas[1].cert_pem
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_publish_without_a_path_trusts_in_memory(cas: list[CertificateAuthority]) -> None:
    pool = TrustPool()
    pool.add(cas[0].cert_pem)
    assert pool.publish(None) is True
    assert pool.publish(None) is False
    assert pool.source() == [cas[0].cert_pem]


def test_load_trusts_what_a_previous_container_published(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    path = tmp_path / "kubernetes-ca.crt"
    first = TrustPool()
    first.add(cas[0].cert_pem)
    first.add(cas[1].cert_pem)
    first.publish(path)
    inode = path.stat().st_ino

    restarted = TrustPool()
    with structlog.testing.capture_logs() as logs:
        assert restarted.load(path) == 2
    assert restarted.extras == [cas[0].cert_pem, cas[1].cert_pem]
    [line] = [e for e in logs if e["event"] == "loaded extra Kubernetes CAs from the trust file"]
    assert line["count"] == 2 and "BEGIN" not in repr(line)
    assert restarted.publish(path) is False and path.stat().st_ino == inode  # on disk already
    assert restarted.newest == cas[1].certificate

    assert TrustPool().load(tmp_path / "missing") == 0
    (tmp_path / "junk").write_bytes(b"not a certificate")
    junk = TrustPool()
    assert junk.load(tmp_path / "junk") == 0 and junk.extras == []
    key = cas[2].key_pem
    assert key is not None
    (tmp_path / "key").write_bytes(key)
    with structlog.testing.capture_logs() as logs:
        assert TrustPool().load(tmp_path / "key") == 0
    assert key.decode().splitlines()[1] not in repr(logs)
    (tmp_path / "leaf").write_bytes(cas[0].cert_pem + issue_talos_client_certificate(cas[0], ["os:admin"]).cert_pem)
    assert TrustPool().load(tmp_path / "leaf") == 0  # not a trust file ichord wrote: ignored whole
    (tmp_path / "empty").write_bytes(b"")
    assert TrustPool().load(tmp_path / "empty") == 0


def test_clear_is_idempotent(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    path = tmp_path / "kubernetes-ca.crt"
    pool = TrustPool()
    pool.add(cas[0].cert_pem)
    pool.publish(path)
    pool.clear(path)
    assert pool.extras == [] and not path.exists() and _gauge() == 0
    pool.clear(path)
    pool.clear(None)
    assert pool.extras == [] and not path.exists()


def test_clear_once_base_trusts_only_when_the_base_holds_the_newest(
        tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    base, path = tmp_path / "ca.crt", tmp_path / "kubernetes-ca.crt"
    old, first, second = cas
    base.write_bytes(old.cert_pem)
    pool = TrustPool(base)
    pool.add(first.cert_pem)
    pool.add(second.cert_pem)
    pool.publish(path)
    assert pool.clear_once_base_trusts(path) is False  # the projected file still lags
    base.write_bytes(first.cert_pem)  # the base trusts an older extra, not the newest
    assert pool.clear_once_base_trusts(path) is False
    assert pool.extras == [first.cert_pem, second.cert_pem] and path.exists()
    base.unlink()  # unreadable base: never cleared
    assert pool.clear_once_base_trusts(path) is False
    base.write_bytes(old.cert_pem + _reformatted(second))  # a bundle holding the newest, other bytes
    assert pool.clear_once_base_trusts(path) is True
    assert pool.extras == [] and not path.exists()
    assert pool.source() == [old.cert_pem + _reformatted(second)]
    assert pool.clear_once_base_trusts(path) is False  # nothing left to clear


def test_clear_once_base_trusts_never_clears_without_a_base(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    pool = TrustPool()  # a kubeconfig run: no base file
    pool.add(cas[0].cert_pem)
    pool.publish(tmp_path / "f")
    assert pool.clear_once_base_trusts(tmp_path / "f") is False and pool.extras == [cas[0].cert_pem]


def test_rotation_hook_adds_and_publishes_only_when_installed(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    path = tmp_path / "kubernetes-ca.crt"
    base = tmp_path / "ca.crt"
    base.write_bytes(cas[2].cert_pem)  # this process's cluster: its current CA is cas[2]
    TrustHooks().trust(cas[0].cert_pem, cas[2].cert_pem)  # no pool (the actors' default hooks): a no-op
    pool = TrustPool(base)
    shared = SharedTrust(pool, path)
    hook = shared.hooks().trust
    hook(cas[0].cert_pem, cas[2].cert_pem)
    assert pool.extras == [cas[0].cert_pem] and path.read_bytes() == cas[0].cert_pem
    key = cas[1].key_pem
    assert key is not None
    with structlog.testing.capture_logs() as logs:
        hook(key, cas[2].cert_pem)  # refused, logged, never raised into the rotation
    assert pool.extras == [cas[0].cert_pem] and logs and key.decode().splitlines()[1] not in repr(logs)
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("x")
    shared.trust_file = blocked / "kubernetes-ca.crt"  # cannot be written: logged, the pool still trusts
    with structlog.testing.capture_logs() as logs:
        hook(cas[1].cert_pem, cas[2].cert_pem)
    assert next(e["event"] for e in logs).startswith("cannot publish the trust file")
    assert pool.extras == [cas[0].cert_pem, cas[1].cert_pem]


def test_rotation_hook_ignores_another_clusters_ca(tmp_path: Path, cas: list[CertificateAuthority]) -> None:
    """A rotation of a cluster whose API server this process does not use: its CA would never reach the
    base ca.crt, so trusting it could never end; it is not added."""
    base = tmp_path / "ca.crt"
    base.write_bytes(cas[2].cert_pem)
    pool = TrustPool(base)
    hook = SharedTrust(pool, tmp_path / "kubernetes-ca.crt").rotation_trust_hook
    hook(cas[0].cert_pem, cas[1].cert_pem)  # new cas[0], current cas[1]: not ours
    assert pool.extras == [] and not (tmp_path / "kubernetes-ca.crt").exists()
    hook(cas[0].cert_pem, cas[2].cert_pem)  # ours
    assert pool.extras == [cas[0].cert_pem]
    base.write_bytes(cas[0].cert_pem)  # the projected ca.crt already holds the new CA: still ours
    hook(cas[1].cert_pem, cas[0].cert_pem)
    assert pool.extras == [cas[0].cert_pem, cas[1].cert_pem]
    assert not TrustPool().trusts_any([cas[0].cert_pem])  # no base (a kubeconfig run): nothing is ours
