"""The one way ichord reads a cluster's bundle Secret (``secrets.yaml`` and, during a rotation, ``rotation.yaml``).

Every read is an uncached GET (the Secret decides irreversible steps); what is parsed from it is kept by the
bytes' digest, so an unchanged bundle is parsed once per process whoever asks:

- ``full()``: the whole SecretsBundle (every key checked, ~0.3 s of CPU for the RSA-4096 service-account key),
  its secrets registered with the scrubber before anything can print them; for rendering and rotating;
- ``public()``: the four CA certificates only, holding no secret; for expiry and the trust pool;
- ``rotation()``: rotation.yaml parsed, its new keys registered with the scrubber;
- ``ca_certificate(kind)``: one current CA's certificate only (the trust pool needs certs.k8s.crt, nothing else);
- ``rotation_ca_certificate(target)``: one new CA's certificate from rotation.yaml, its key never decoded.

Failures are ``BundleSourceError`` with a reason a condition can carry (SecretNotFound, BundleUnavailable,
BundleInvalid, RotationInvalid) and a message that names the Secret and never quotes it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from cryptography import x509
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.api import names
from ichord.api.views import ClusterView
from ichord.errors import IchordError
from ichord.kube.client import KubeClient
from ichord.kube.errors import Forbidden, KubeError, NotFound
from ichord.kube.forbidden import forbidden_message
from ichord.kube.reads import SecretData, read_secret
from ichord.pki import pem as _pem
from ichord.pki.bundle import BundleError, SecretsBundle, extra_keys
from ichord.pki.ca import CAKind, CertificateAuthority
from ichord.pki.rotation import Rotation, RotationError, Target
from ichord.pki.scrub import SCRUBBER
from ichord.render import fastload

T = TypeVar("T")


class BundleSourceError(IchordError):
    """The bundle Secret cannot be used; ``reason`` is what a condition shows, the message never quotes it."""

    SECRET_NOT_FOUND = "SecretNotFound"  # noqa: S105 - a condition reason
    UNAVAILABLE = "BundleUnavailable"  # the API did not answer: transient
    INVALID = "BundleInvalid"
    ROTATION_INVALID = "RotationInvalid"
    CROSS_NAMESPACE_REFUSED = "CrossNamespaceRefused"  # secretsRef outside the cluster's namespace, not allowed
    FORBIDDEN = names.ReadyReason.FORBIDDEN  # the management API answered 403 (RBAC does not grant the read)

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---- parse memos (by the bytes' digest: same bytes, same result; nothing decided is kept) ---------------

_MEMO_MAX = 4096


class _Memo(OrderedDict[bytes, object]):
    def get_or(self, raw: bytes, make: Callable[[], T]) -> T:
        key = hashlib.sha256(raw).digest()
        if key in self:
            self.move_to_end(key)
            return self[key]  # type: ignore[return-value]
        value = make()
        self[key] = value
        while len(self) > _MEMO_MAX:
            self.popitem(last=False)
        return value


_FULL = _Memo()
_PUBLIC = _Memo()
_ROTATIONS = _Memo()
_CA_CERTS = _Memo()
_CA_ENTRIES = {CAKind.OS: "os", CAKind.KUBERNETES: "k8s", CAKind.AGGREGATOR: "k8saggregator", CAKind.ETCD: "etcd"}


def full_bundle(raw: bytes, source: str) -> SecretsBundle:
    """The whole bundle, parsed once per bytes; its secrets join the scrubber before it is returned."""
    def make() -> SecretsBundle:
        bundle = SecretsBundle.from_yaml(raw, source)
        SCRUBBER.register_all(bundle.secret_values())
        return bundle
    return _FULL.get_or(raw, make)


def public_bundle(raw: bytes, source: str = "secrets bundle") -> SecretsBundle:
    """The bundle's four CA certificates as a SecretsBundle holding no secret (every secret field empty).

    Expiry and the trust pool need the certificates only: this parses just them (a full parse checks every
    key). Key defects are the machine reconciler's to report (BundleInvalid). Never save this view.
    """
    return _PUBLIC.get_or(raw, lambda: _parse_public(raw, source))


def _parse_public(raw: bytes, source: str) -> SecretsBundle:
    try:
        doc = YAML(typ="safe").load(raw)
    except (YAMLError, ValueError, UnicodeError, RecursionError):
        # The parser's message may quote the input: say only that it failed.
        raise BundleError(["it is not valid YAML"], source) from None
    if not isinstance(doc, dict):
        raise BundleError(["it is not a YAML mapping"], source)
    problems: list[str] = []
    cas: dict[CAKind, CertificateAuthority] = {}
    certs = doc.get("certs")
    for kind, entry in _CA_ENTRIES.items():
        ca = _public_ca(certs.get(entry) if isinstance(certs, dict) else None, entry, problems)
        if ca is not None:
            cas[kind] = ca
    extra: dict[str, CertificateAuthority] = {}
    for key in extra_keys():  # a registered target's CA kept beside Talos's four: optional (absent until rotated)
        entry_doc = certs.get(key) if isinstance(certs, dict) else None
        if entry_doc is not None:
            ca = _public_ca(entry_doc, key, problems)
            if ca is not None:
                extra[key] = ca
    if problems:
        raise BundleError(problems, source)
    return SecretsBundle(
        cluster_id="", cluster_secret="", bootstrap_token="", trustd_token="", secretbox_encryption_secret=None,
        aescbc_encryption_secret=None, etcd=cas[CAKind.ETCD], k8s=cas[CAKind.KUBERNETES],
        k8s_aggregator=cas[CAKind.AGGREGATOR], k8s_service_account_key=b"", os=cas[CAKind.OS], extra_cas=extra)


def _public_ca(entry_doc: object, entry: str, problems: list[str]) -> CertificateAuthority | None:
    """certs.<entry>'s certificate alone (its key never decoded), or None with the defect in ``problems``."""
    crt = entry_doc.get("crt") if isinstance(entry_doc, dict) else None
    if not isinstance(crt, str) or not crt:
        problems.append(f"certs.{entry}.crt is missing")
        return None
    try:
        ca = CertificateAuthority(_pem.b64_pem_decode(crt, f"certs.{entry}.crt"))
        cert = _pem.load_certificate(ca.cert_pem, f"certs.{entry}.crt")
    except _pem.PEMError as exc:
        problems.append(str(exc))
        return None
    if not _is_ca(cert):
        problems.append(f"certs.{entry}.crt is not a CA certificate")
        return None
    return ca


def _plain(raw: bytes) -> object:
    """The YAML document as plain data, by libyaml when it gives ruamel's answer (fastload), else by ruamel.

    On the trust sync's path from a rotation's Accepting to the follower's publish: ruamel's round trip took
    ~9 ms of a ~16 ms publish for secrets.yaml alone (bench_trust); libyaml takes well under one."""
    try:
        docs = fastload.load_documents(raw)
    except fastload.Unsupported:
        return yamlio.load(raw)
    return docs[0] if len(docs) == 1 else yamlio.load(raw)


def _ca_certificate(raw: bytes, entry: str) -> bytes | None:
    try:
        crt = _plain(raw)["certs"][entry]["crt"]  # type: ignore[index]
        return _pem.b64_pem_decode(str(crt), f"certs.{entry}.crt")
    except (YAMLError, KeyError, TypeError, _pem.PEMError):
        return None


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def parse_rotation(raw: bytes) -> Rotation:
    """rotation.yaml parsed once per bytes; every new CA key joins the scrubber before it is returned."""
    def make() -> Rotation:
        rotation = Rotation.from_yaml(raw)
        SCRUBBER.register_all(ca.key_pem for ca in rotation.new.values() if ca.key_pem)
        return rotation
    return _ROTATIONS.get_or(raw, make)


def rotation_ca_certificate(raw: bytes, target: Target) -> bytes | None:
    """The certificate of ``target``'s new CA in rotation.yaml (None when it is not a target); the key is
    never decoded, kept or passed on."""
    try:
        doc = _plain(raw)
    except YAMLError:
        raise BundleSourceError(BundleSourceError.ROTATION_INVALID, f"{names.ROTATION_KEY} is not valid YAML") from None
    if not isinstance(doc, dict):
        raise BundleSourceError(BundleSourceError.ROTATION_INVALID, f"{names.ROTATION_KEY} is not a mapping")
    entry = doc.get(target.rotation_key)
    if entry is None:
        return None
    crt = entry.get("crt") if isinstance(entry, dict) else None
    if not crt:
        raise BundleSourceError(BundleSourceError.ROTATION_INVALID,
                                f"{names.ROTATION_KEY} has a {target.rotation_key} entry without crt")
    try:
        return _pem.b64_pem_decode(str(crt), f"{target.rotation_key}.crt")
    except _pem.PEMError as exc:
        raise BundleSourceError(BundleSourceError.ROTATION_INVALID, f"{names.ROTATION_KEY}: {exc}") from None


# ---- one read of the Secret --------------------------------------------------------------------


@dataclass(frozen=True)
class BundleRead:
    """The bundle Secret as read once; the views are parsed on demand (and memoised by content)."""

    secret: SecretData = field(repr=False)

    @property
    def where(self) -> str:
        return f"Secret {self.secret.namespace}/{self.secret.name}"

    @property
    def resource_version(self) -> str:
        return self.secret.resource_version

    @property
    def raw(self) -> bytes:
        raw = self.secret.data.get(names.SECRETS_KEY)
        if raw is None:
            raise BundleSourceError(BundleSourceError.INVALID, f"{self.where} has no key {names.SECRETS_KEY}; put "
                                                               f"the Talos secrets bundle there")
        return raw

    @property
    def raw_rotation(self) -> bytes | None:
        return self.secret.data.get(names.ROTATION_KEY)

    def full(self) -> SecretsBundle:
        try:
            return full_bundle(self.raw, f"{self.where} key {names.SECRETS_KEY}")
        except BundleError as exc:
            raise BundleSourceError(BundleSourceError.INVALID, str(exc)) from None

    def public(self) -> SecretsBundle:
        try:
            return public_bundle(self.raw, f"{self.where} key {names.SECRETS_KEY}")
        except BundleError as exc:
            raise BundleSourceError(BundleSourceError.INVALID, str(exc)) from None

    def rotation(self) -> Rotation | None:
        raw = self.raw_rotation
        if raw is None:
            return None
        try:
            return parse_rotation(raw)
        except (RotationError, BundleError, ValueError) as exc:
            raise BundleSourceError(BundleSourceError.ROTATION_INVALID,
                                    f"{names.ROTATION_KEY} in {self.where}: {SCRUBBER.exception(exc)}") from None

    def ca_certificate(self, kind: CAKind) -> bytes | None:
        """The current ``kind`` CA's certificate from secrets.yaml alone (None when it cannot be read); no key is
        decoded and the rest of the bundle need not be valid."""
        raw = self.secret.data.get(names.SECRETS_KEY)
        if raw is None:
            return None
        entry = _CA_ENTRIES[kind]
        return _CA_CERTS.get_or(raw + b"\0" + entry.encode(), lambda: _ca_certificate(raw, entry))

    def rotation_ca_certificate(self, target: Target) -> bytes | None:
        raw = self.raw_rotation
        return None if raw is None else rotation_ca_certificate(raw, target)


async def read_cluster_bundle(kube: KubeClient, cluster: ClusterView, allowed: frozenset[str]) -> BundleRead:
    """The cluster's bundle Secret, where its secretsRef resolves; refused (nothing read) across namespaces
    the administrator did not allow."""
    refusal = cluster.secret_refusal(allowed)
    if refusal is not None:
        raise BundleSourceError(BundleSourceError.CROSS_NAMESPACE_REFUSED, refusal)
    return await read_bundle_secret(kube, cluster.secret_namespace, cluster.secret_name,
                                    cluster_namespace=cluster.namespace)


async def read_bundle_secret(kube: KubeClient, namespace: str, name: str, *,
                             cluster_namespace: str | None = None) -> BundleRead:
    """GET the bundle Secret (uncached); failures are BundleSourceError naming it (a 403: the chart value that
    grants the read, judged against ``cluster_namespace``, the namespace of the TalosCluster naming it)."""
    where = f"Secret {namespace}/{name}"
    if not name:
        raise BundleSourceError(BundleSourceError.INVALID, "spec.secretsRef.name is empty; name the bundle Secret "
                                                           "there")
    try:
        return BundleRead(await read_secret(kube, namespace, name))
    except NotFound:
        raise BundleSourceError(BundleSourceError.SECRET_NOT_FOUND,
                                f"{where} (spec.secretsRef) does not exist; create it with the cluster's "
                                f"secrets.yaml") from None
    except Forbidden as exc:
        raise BundleSourceError(BundleSourceError.FORBIDDEN, f"cannot read {where}: "
                                f"{forbidden_message(exc, cluster_namespace=cluster_namespace)}") from None
    except KubeError as exc:
        raise BundleSourceError(BundleSourceError.UNAVAILABLE, f"cannot read {where}: {exc}") from None
