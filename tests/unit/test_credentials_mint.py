"""The credentials minted for the operator: file formats, certificates, the pinned dial, private files."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ichord import yamlio
from ichord.credentials.mint import issue_kubernetes_admin_certificate, mint, talosconfig_dial
from ichord.pki import pem as _pem
from ichord.pki.ca import CAKind, CertificateAuthority, generate_ca
from ichord.safefile import DestinationError, make_private_dirs, write_file


@pytest.fixture(scope="module")
def cas() -> dict[str, CertificateAuthority]:
    return {"os_old": generate_ca(CAKind.OS), "os_new": generate_ca(CAKind.OS),
            "k8s_old": generate_ca(CAKind.KUBERNETES), "k8s_new": generate_ca(CAKind.KUBERNETES)}


def test_the_admin_certificate_is_what_talos_hands_out(cas: dict[str, CertificateAuthority]) -> None:
    ca = cas["k8s_new"]
    cert = issue_kubernetes_admin_certificate(ca)
    x = _pem.load_certificate(cert.cert_pem)
    assert x.subject.rfc4514_string() == "CN=admin,O=system:masters"
    assert x.issuer == ca.certificate.subject
    x.verify_directly_issued_by(ca.certificate)
    assert list(x.extensions.get_extension_for_class(
        x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert b"BEGIN EC PRIVATE KEY" in cert.key_pem and "PRIVATE" not in repr(cert)
    assert _pem.key_matches_certificate(_pem.load_private_key(cert.key_pem), x)


def test_both_files(cas: dict[str, CertificateAuthority]) -> None:
    os_old, os_new, k_old, k_new = (cas[k] for k in ("os_old", "os_new", "k8s_old", "k8s_new"))
    minted = mint("prod", ["10.0.0.2", "10.0.0.3:50001"], "https://10.0.0.1:6443",
                  os_signing=os_new, os_trusted=[os_old.cert_pem, os_new.cert_pem, os_new.cert_pem],
                  k8s_signing=k_new, k8s_trusted=[k_old.cert_pem, k_new.cert_pem], namespace="clusters")
    assert "BEGIN" not in repr(minted) and "key" not in repr(minted)
    tc = yamlio.load(minted.talosconfig)
    assert tc["context"] == "prod" and list(tc["contexts"]) == ["prod"]
    ctx = tc["contexts"]["prod"]
    assert ctx["endpoints"] == ["10.0.0.2", "10.0.0.3:50001"] and ctx["nodes"] == ["10.0.0.2", "10.0.0.3"]
    trusted = _pem.pem_blocks(base64.b64decode(ctx["ca"]))
    assert trusted == [_pem.pem_blocks(os_old.cert_pem)[0], _pem.pem_blocks(os_new.cert_pem)[0]]
    crt = _pem.load_certificate(base64.b64decode(ctx["crt"]))
    crt.verify_directly_issued_by(os_new.certificate)
    assert [a.value for a in crt.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["os:admin"]
    assert b"ED25519 PRIVATE KEY" in base64.b64decode(ctx["key"])  # Talos's own label, as talosctl reads it
    kc = yamlio.load(minted.kubeconfig)
    assert kc["current-context"] == "admin@prod" and kc["clusters"][0]["cluster"]["server"] == "https://10.0.0.1:6443"
    # The TalosCluster's namespace: `ichord cluster status prod --kubeconfig FILE` finds it without -n.
    assert kc["contexts"][0]["context"]["namespace"] == "clusters"
    assert len(_pem.pem_blocks(base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"]))) == 2
    kcrt = _pem.load_certificate(base64.b64decode(kc["users"][0]["user"]["client-certificate-data"]))
    kcrt.verify_directly_issued_by(k_new.certificate)

    dial, endpoints = talosconfig_dial(minted.talosconfig, os_old)
    assert endpoints == ["10.0.0.2", "10.0.0.3:50001"]
    assert dial.client_certificate().cert_pem == base64.b64decode(ctx["crt"])  # the file's, never a new one
    assert dial.client_certificate() is dial.client_certificate() and len(dial.trusted_cas) == 2
    assert "PRIVATE" not in repr(dial)


def test_private_files_are_0600_in_0700_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "kubeconfig"
    with pytest.raises(DestinationError, match="is not a directory; create it first"):
        write_file(path, b"one")  # a directory the user names must exist
    make_private_dirs(path.parent)  # ichord's own default place is created 0700
    write_file(path, b"one")
    with pytest.raises(DestinationError, match="exists; it is not overwritten"):
        write_file(path, b"two")
    write_file(path, b"two", force=True)  # replaced atomically, still 0600
    assert path.read_bytes() == b"two" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["kubeconfig"]  # no temporary file left behind
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anyway
        with pytest.raises(DestinationError, match=r"ro is not writable"):
            write_file(tmp_path / "ro" / "x", b"x")
