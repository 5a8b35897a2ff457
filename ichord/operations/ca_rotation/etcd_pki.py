"""The etcd PKI a control plane must report at a stage (docs/decisions.md#etcd-reboot-roll).

The old and the new etcd CA share their subject (O=etcd), so a certificate's issuer *name* says
nothing about which CA signed it: every check here is by signature, and the leaf's Authority Key
Identifier must name the CA's Subject Key Identifier. Only certificates are read; keys never are.

    stage       secrets.EtcdRoot (cluster.etcd.ca.crt)   secrets.Etcd leaves signed by
    Accepting   old, new (in that order)                 old
    Issuing     new, old                                 new
    Dropping    new                                      new
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from ichord.api.carotation import Stage
from ichord.pki import pem as _pem
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import certificate_fingerprint
from ichord.pki.pem import PEMError
from ichord.pki.rotation import Rotation, Target
from ichord.render.stages import STAGE_TABLE, Which
from ichord.talos.client import TalosClient


@dataclass(frozen=True)
class ExpectedPKI:
    """What a control plane's etcd PKI is at a stage: the trust bundle in order, and the signing CA."""

    bundle: tuple[bytes, ...]  # certificate PEM blocks, first signs
    signer: bytes
    signer_name: str  # "old" or "new", for messages (never a certificate)


def expected_pki(bundle: SecretsBundle, rotation: Rotation, stage: Stage) -> ExpectedPKI:
    old, new = bundle.etcd.cert_pem, rotation.new[Target.ETCD].cert_pem
    row = STAGE_TABLE[stage]
    of = {Which.OLD: old, Which.NEW: new}
    certs = [of[row.signing]] + ([of[row.trusted]] if row.trusted is not None else [])
    blocks = tuple(b for c in certs for b in _pem.pem_blocks(c) if _pem.pem_label(b) == "CERTIFICATE")
    return ExpectedPKI(blocks, of[row.signing], row.signing.value)


def signed_by(leaf_pem: bytes, ca_pem: bytes) -> bool:
    """True when ``ca_pem`` signed ``leaf_pem``: the signature verifies and the AKI (when present) is the CA's key."""
    try:
        leaf, ca = _pem.load_certificate(leaf_pem, "leaf"), _pem.load_certificate(ca_pem, "CA")
    except PEMError:
        return False
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    try:
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        return True  # the signature decided
    try:
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
    except x509.ExtensionNotFound:
        ski = x509.SubjectKeyIdentifier.from_public_key(ca.public_key()).digest
    return aki is None or aki == ski


def _blocks(data: bytes) -> tuple[bytes, ...]:
    return tuple(b for b in _pem.pem_blocks(data) if _pem.pem_label(b) == "CERTIFICATE")


async def pki_problem(talos: TalosClient, name: str, endpoint: str, expected: ExpectedPKI, *,
                      every_leaf: bool = False) -> str | None:
    """Why the control plane ``name`` does not report the stage's etcd PKI (None: it does).

    The gate asks for the root's blocks and order and the server certificate; ``every_leaf`` adds the peer and
    the kube-apiserver client certificates (checked before Dropping takes the old CA away)."""
    root = await talos.etcd_root(endpoint)
    have = _blocks(root.ca_bundle)
    if have != expected.bundle:
        fps = ", ".join(certificate_fingerprint(_pem.load_certificate(b))[:16] for b in have) or "nothing"
        return (f"etcd on {name} trusts {len(have)} CA certificate(s) ({fps}) where the stage expects "
                f"{len(expected.bundle)}, the {expected.signer_name} etcd CA first")
    leaves = await talos.etcd_certs(endpoint)
    checked = [("server", leaves.etcd)]
    if every_leaf:
        checked += [("peer", leaves.etcd_peer), ("kube-apiserver client", leaves.etcd_api_server)]
    for what, leaf in checked:
        if not signed_by(leaf, expected.signer):
            return f"the etcd {what} certificate of {name} is not signed by the {expected.signer_name} etcd CA"
    return None
