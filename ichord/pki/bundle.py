"""The Talos secrets bundle (``secrets.yaml``), byte-compatible with ``talosctl gen secrets``.

Layout (Talos's API definitions): cluster.{id,secret}; secrets.{bootstraptoken,
secretboxencryptionsecret | aescbcencryptionsecret}; trustdinfo.token; certs.{etcd,k8s,k8saggregator,
os}.{crt,key} and certs.k8sserviceaccount.key, every crt/key base64 of the PEM text.

A bundle loaded from YAML keeps its parsed document (comments, key order, quoting), so saving an
unchanged bundle writes back the very bytes it was loaded from, and a changed one changes only the
values that changed.
"""

from __future__ import annotations

import base64
import datetime as dt
import os as _os
import secrets as _secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.contract import DEFAULT_CONTRACT, VersionContract
from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.pki import targets as ca_targets
from ichord.pki.ca import CAKind, CAProfile, CertificateAuthority, KeyAlgorithm, generate_ca, generate_key
from ichord.safefile import DestinationError, write_file


class BundleError(IchordError):
    """The secrets bundle is malformed or partial. ``problems`` lists every defect found."""

    def __init__(self, problems: list[str], source: str = "secrets bundle") -> None:
        self.problems = problems
        super().__init__(
            f"{source} is not a valid Talos secrets bundle: "
            + "; ".join(problems)
            + ". Regenerate it with `ichord bundle generate` or `talosctl gen secrets`, or restore it from a backup."
        )


#: ``save`` refused the destination (it exists without ``force``, its directory does not): ichord.safefile's error.
BundleExistsError = DestinationError


_TOKEN_ALPHABET = string.ascii_lowercase + string.digits


def _token(n: int) -> str:
    return "".join(_secrets.choice(_TOKEN_ALPHABET) for _ in range(n))


def generate_token() -> str:
    """A ``xxxxxx.yyyyyyyyyyyyyyyy`` token (bootstrap token, trustd token)."""
    return f"{_token(6)}.{_token(16)}"


@dataclass(frozen=True)
class SecretsBundle:
    cluster_id: str = field(repr=False)
    cluster_secret: str = field(repr=False)
    bootstrap_token: str = field(repr=False)
    trustd_token: str = field(repr=False)
    secretbox_encryption_secret: str | None = field(repr=False)
    aescbc_encryption_secret: str | None = field(repr=False)
    etcd: CertificateAuthority
    k8s: CertificateAuthority
    k8s_aggregator: CertificateAuthority
    k8s_service_account_key: bytes = field(repr=False)
    os: CertificateAuthority
    # The parsed document this bundle came from, for a faithful round trip; None when generated.
    _document: Any = field(default=None, repr=False, compare=False)
    #: certs.<key> -> a CA ichord keeps beside Talos's four: a registered CA-rotation target's whose ``ca_kind`` is
    #: a bundle key (ichord/pki/targets). Talos reads none of them; absent from a bundle made before the target.
    extra_cas: Mapping[str, CertificateAuthority] = field(default_factory=dict, hash=False)

    def ca(self, kind: CAKind | str) -> CertificateAuthority:
        """The CA of ``kind``: one of Talos's four, or an extra CA by its bundle key (BundleError when absent)."""
        key = kind.value if isinstance(kind, CAKind) else kind
        own = {CAKind.OS.value: self.os, CAKind.ETCD.value: self.etcd, CAKind.KUBERNETES.value: self.k8s,
               CAKind.AGGREGATOR.value: self.k8s_aggregator}
        if key in own:
            return own[key]
        try:
            return self.extra_cas[key]
        except KeyError:
            raise BundleError([f"certs.{key} is missing (the CA of a CA-rotation target ichord keeps in the bundle; "
                               "rotate the target to create it)"]) from None

    def holds(self, kind: CAKind | str) -> bool:
        """Whether the bundle has the CA of ``kind`` (Talos's four always)."""
        return isinstance(kind, CAKind) or kind in {k.value for k in CAKind} or kind in self.extra_cas

    def with_cas(self, cas: Mapping[CAKind | str, CertificateAuthority]) -> SecretsBundle:
        """A copy with some CAs replaced (everything else, cluster ID and secret included, kept)."""
        by_key = {(k.value if isinstance(k, CAKind) else k): ca for k, ca in cas.items()}
        own = {k.value for k in CAKind}
        return replace(
            self,
            os=by_key.get(CAKind.OS.value, self.os),
            etcd=by_key.get(CAKind.ETCD.value, self.etcd),
            k8s=by_key.get(CAKind.KUBERNETES.value, self.k8s),
            k8s_aggregator=by_key.get(CAKind.AGGREGATOR.value, self.k8s_aggregator),
            extra_cas={**self.extra_cas, **{k: ca for k, ca in by_key.items() if k not in own}},
        )

    def secret_values(self) -> list[str]:
        """Every secret this bundle holds, in the encodings it may appear in (for the scrubber)."""
        out = [self.cluster_secret, self.bootstrap_token, self.trustd_token]
        out += [s for s in (self.secretbox_encryption_secret, self.aescbc_encryption_secret) if s]
        for ca in (self.os, self.etcd, self.k8s, self.k8s_aggregator, *self.extra_cas.values()):
            if ca.key_pem:
                out.append(ca.key_pem.decode())
        out.append(self.k8s_service_account_key.decode())
        return out

    # ---- encoding -------------------------------------------------------------------------

    def to_yaml(self) -> str:
        doc = self._document if self._document is not None else _new_document()
        _set_path(doc, ("cluster", "id"), self.cluster_id)
        _set_path(doc, ("cluster", "secret"), self.cluster_secret)
        _set_path(doc, ("secrets", "bootstraptoken"), self.bootstrap_token)
        for key, value in (
            ("secretboxencryptionsecret", self.secretbox_encryption_secret),
            ("aescbcencryptionsecret", self.aescbc_encryption_secret),
        ):
            if value:
                _set_path(doc, ("secrets", key), value)
            elif key in doc.get("secrets", {}):
                del doc["secrets"][key]
        _set_path(doc, ("trustdinfo", "token"), self.trustd_token)
        for kind, ca in (
            (CAKind.ETCD, self.etcd),
            (CAKind.KUBERNETES, self.k8s),
            (CAKind.AGGREGATOR, self.k8s_aggregator),
        ):
            _set_ca(doc, kind.value, ca)
        _set_path(doc, ("certs", "k8sserviceaccount", "key"), _pem.b64_pem_encode(self.k8s_service_account_key))
        _set_ca(doc, CAKind.OS.value, self.os)
        for key, ca in self.extra_cas.items():
            _set_ca(doc, key, ca)
        return yamlio.dump(doc)

    @classmethod
    def from_yaml(cls, text: str | bytes, source: str = "secrets bundle") -> SecretsBundle:
        try:
            doc = yamlio.load(text)
        except YAMLError as exc:
            # The parser's message may quote the input; keep only where it failed.
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            raise BundleError([f"it is not valid YAML{where}"], source) from None
        if not isinstance(doc, dict):
            raise BundleError(["it is not a YAML mapping"], source)
        return _parse(doc, source)

    # ---- files ----------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | _os.PathLike[str]) -> SecretsBundle:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise BundleError([f"it cannot be read ({exc.strerror})"], str(p)) from None
        return cls.from_yaml(data, str(p))

    def save(self, path: str | _os.PathLike[str], *, force: bool = False) -> Path:
        """Write with mode 0600 (as talosctl does), atomically; refuse an existing file unless ``force``, and a
        directory that does not exist (ichord.safefile). The absolute path written."""
        return write_file(Path(path), self.to_yaml().encode(), force=force)


def generate_bundle(contract: VersionContract = DEFAULT_CONTRACT, *, now: dt.datetime | None = None) -> SecretsBundle:
    """A new bundle, as ``talosctl gen secrets`` makes it for ``contract``."""
    now = now or dt.datetime.now(dt.UTC)
    # Contracts > 1.6 use an RSA-4096 service-account key (UseRSAServiceAccountKey); > 1.2 secretbox.
    sa_alg = KeyAlgorithm.RSA_4096 if (contract.major, contract.minor) > (1, 6) else KeyAlgorithm.ECDSA_P256
    return SecretsBundle(
        cluster_id=base64.urlsafe_b64encode(_secrets.token_bytes(32)).decode(),
        cluster_secret=base64.b64encode(_secrets.token_bytes(32)).decode(),
        bootstrap_token=generate_token(),
        trustd_token=generate_token(),
        secretbox_encryption_secret=base64.b64encode(_secrets.token_bytes(32)).decode(),
        aescbc_encryption_secret=None,
        etcd=generate_ca(CAKind.ETCD, now=now),
        k8s=generate_ca(CAKind.KUBERNETES, now=now),
        k8s_aggregator=generate_ca(CAKind.AGGREGATOR, now=now),
        k8s_service_account_key=_pem.encode_private_key(generate_key(sa_alg)),
        os=generate_ca(CAKind.OS, now=now),
        extra_cas={key: generate_ca(profile, now=now) for key, profile in _extra_profiles().items()},
    )


def extra_keys() -> tuple[str, ...]:
    """The bundle keys of the registered targets' CAs that are not Talos's four."""
    return tuple(_extra_profiles())


def _extra_profiles() -> dict[str, CAProfile]:
    return {t.bundle_key: t.ca_profile for t in ca_targets.REGISTRY if not isinstance(t.ca_kind, CAKind)}


# ---- parsing ------------------------------------------------------------------------------


def _new_document() -> CommentedMap:
    doc = CommentedMap()
    for section in ("cluster", "secrets", "trustdinfo", "certs"):
        doc[section] = CommentedMap()
    for entry in ("etcd", "k8s", "k8saggregator", "k8sserviceaccount", "os"):
        doc["certs"][entry] = CommentedMap()
    return doc


def _set_path(doc: Any, path: tuple[str, ...], value: str) -> None:
    node = doc
    for key in path[:-1]:
        if key not in node or not isinstance(node[key], dict):
            node[key] = CommentedMap()
        node = node[key]
    if node.get(path[-1]) != value:  # keep the original scalar (and its quoting) when unchanged
        node[path[-1]] = value


def _set_ca(doc: Any, entry: str, ca: CertificateAuthority) -> None:
    _set_path(doc, ("certs", entry, "crt"), _pem.b64_pem_encode(ca.cert_pem))
    if ca.key_pem is not None:
        _set_path(doc, ("certs", entry, "key"), _pem.b64_pem_encode(ca.key_pem))


def _get(doc: Any, path: tuple[str, ...], problems: list[str], *, required: bool = True) -> str | None:
    node = doc
    for key in path:
        if not isinstance(node, dict) or key not in node or node[key] in (None, ""):
            if required:
                problems.append(f"{'.'.join(path)} is missing")
            return None
        node = node[key]
    if not isinstance(node, str):
        problems.append(f"{'.'.join(path)} is not a string")
        return None
    return node


def _parse_ca(doc: Any, entry: str, problems: list[str]) -> CertificateAuthority | None:
    crt = _get(doc, ("certs", entry, "crt"), problems)
    key = _get(doc, ("certs", entry, "key"), problems)
    if crt is None or key is None:
        return None
    try:
        cert_pem = _pem.b64_pem_decode(crt, f"certs.{entry}.crt")
        key_pem = _pem.b64_pem_decode(key, f"certs.{entry}.key")
        ca = CertificateAuthority(cert_pem, key_pem)
        cert = ca.certificate
    except _pem.PEMError as exc:
        problems.append(str(exc))
        return None
    try:
        private = ca.private_key
    except _pem.PEMError:
        problems.append(f"certs.{entry}.key is not a private key (label {_label_or_none(key_pem)})")
        return None
    if not _pem.key_matches_certificate(private, cert):
        problems.append(f"certs.{entry}.key does not belong to certs.{entry}.crt")
        return None
    bc = _basic_constraints_ca(cert)
    if not bc:
        problems.append(f"certs.{entry}.crt is not a CA certificate")
        return None
    return ca


def _label_or_none(data: bytes) -> str:
    try:
        return _pem.pem_label(data)
    except _pem.PEMError:
        return "none"


def _basic_constraints_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _parse(doc: Any, source: str) -> SecretsBundle:
    problems: list[str] = []
    cluster_id = _get(doc, ("cluster", "id"), problems)
    cluster_secret = _get(doc, ("cluster", "secret"), problems)
    bootstrap = _get(doc, ("secrets", "bootstraptoken"), problems)
    secretbox = _get(doc, ("secrets", "secretboxencryptionsecret"), problems, required=False)
    aescbc = _get(doc, ("secrets", "aescbcencryptionsecret"), problems, required=False)
    if bool(secretbox) == bool(aescbc):
        problems.append(
            "exactly one of secrets.secretboxencryptionsecret and secrets.aescbcencryptionsecret must be set"
            + (" (both are)" if secretbox else " (neither is)")
        )
    trustd = _get(doc, ("trustdinfo", "token"), problems)
    cas = {entry: _parse_ca(doc, entry, problems) for entry in ("etcd", "k8s", "k8saggregator", "os")}
    sa_key = None
    sa_b64 = _get(doc, ("certs", "k8sserviceaccount", "key"), problems)
    if sa_b64 is not None:
        try:
            sa_key = _pem.b64_pem_decode(sa_b64, "certs.k8sserviceaccount.key")
            _pem.load_private_key(sa_key, "certs.k8sserviceaccount.key")
        except _pem.PEMError as exc:
            problems.append(str(exc))
    if problems:
        raise BundleError(problems, source)
    assert cluster_id and cluster_secret and bootstrap and trustd and sa_key  # noqa: PT018 - narrowed above
    extra = {key: ca for key in extra_keys() if _has_entry(doc, key) and (ca := _parse_ca(doc, key, problems))}
    if problems:
        raise BundleError(problems, source)
    etcd, k8s, agg, os_ca = cas["etcd"], cas["k8s"], cas["k8saggregator"], cas["os"]
    assert etcd and k8s and agg and os_ca  # noqa: PT018
    return SecretsBundle(
        cluster_id=cluster_id,
        cluster_secret=cluster_secret,
        bootstrap_token=bootstrap,
        trustd_token=trustd,
        secretbox_encryption_secret=secretbox,
        aescbc_encryption_secret=aescbc,
        etcd=etcd,
        k8s=k8s,
        k8s_aggregator=agg,
        k8s_service_account_key=sa_key,
        os=os_ca,
        _document=doc,
        extra_cas=extra,
    )


def _has_entry(doc: Any, key: str) -> bool:
    certs = doc.get("certs")
    return isinstance(certs, dict) and key in certs
