"""What a simulated node reads from its running configuration: CAs, trust lists, role, inputs.

Both Kubernetes CA layouts are read as Talos does: the ``KubeAPIServerCAConfig`` document when
present (raw PEM, ``cert``/``key``), otherwise the legacy v1alpha1 ``cluster.ca`` +
``cluster.acceptedCAs`` (base64 of PEM, ``crt``/``key``); the issuing certificate is always part of
the accepted set. ``cluster.etcd.ca.crt`` may hold a bundle: its first block signs, every block is
trusted (docs/decisions.md#ca-rotation-passes).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import hashes as _hashes

from ichord.errors import IchordError
from ichord.pki import pem as _pem
from ichord.render.config import MachineConfig

MACHINE_TYPES = ("controlplane", "init", "worker", "join")


class ConfigInvalidError(IchordError):
    """The configuration fails validation; ``problems`` lists each defect (Talos multierror style)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        n = len(problems)
        body = "".join(f"\n\t* {p}" for p in problems)
        super().__init__(f"{n} error{'s' if n != 1 else ''} occurred:{body}\n\n")


@dataclass(frozen=True)
class CAView:
    """A CA as the configuration names it: certificate PEM (first block signs) and maybe a key."""

    cert_pem: bytes
    key_pem: bytes | None = field(default=None, repr=False)

    @property
    def certificates(self) -> list[bytes]:
        return [b for b in _pem.pem_blocks(self.cert_pem) if _pem.pem_label(b) == "CERTIFICATE"]

    @property
    def signer_pem(self) -> bytes:
        return self.certificates[0]


def _b64(value: Any, what: str, problems: list[str], *, required: bool = True) -> bytes | None:
    if value in (None, ""):
        if required:
            problems.append(f"{what} is required")
        return None
    if not isinstance(value, str):
        problems.append(f"{what} must be a base64 string")
        return None
    try:
        return base64.b64decode(value.encode(), validate=True)
    except (binascii.Error, ValueError):
        problems.append(f"{what} is not valid base64")
        return None


def _cert(data: bytes | None, what: str, problems: list[str]) -> bytes | None:
    if data is None:
        return None
    try:
        _pem.load_certificates(data, what)
    except _pem.PEMError as exc:
        problems.append(str(exc))
        return None
    return data


def _key(data: bytes | None, what: str, problems: list[str]) -> bytes | None:
    if not data:
        return None
    try:
        _pem.load_private_key(data, what)
    except _pem.PEMError as exc:
        problems.append(str(exc))
        return None
    return data


def _get(node: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class ConfigView:
    config: MachineConfig = field(repr=False)
    machine_type: str
    token: str = field(repr=False)
    os_ca: CAView
    os_accepted: tuple[bytes, ...]
    k8s_issuing: CAView | None
    k8s_accepted: tuple[bytes, ...]
    aggregator_issuing: CAView | None
    aggregator_accepted: tuple[bytes, ...]
    etcd_ca: CAView | None
    endpoint: str
    cluster_name: str
    hostname: str | None

    @property
    def is_control_plane(self) -> bool:
        return self.machine_type in ("controlplane", "init")

    @property
    def os_trust(self) -> tuple[bytes, ...]:
        """OS CAs whose client certificates apid accepts: machine.ca + machine.acceptedCAs."""
        out: list[bytes] = []
        for pem in (self.os_ca.signer_pem, *self.os_accepted):
            for block in _pem.pem_blocks(pem):
                if block not in out:
                    out.append(block)
        return tuple(out)

    @property
    def kubelet_inputs(self) -> str:
        """What the kubelet loads (the Kubernetes CA bundle): a change restarts it."""
        issuing = self.k8s_issuing.cert_pem.decode() if self.k8s_issuing else ""
        return _hash(issuing, [c.decode() for c in self.k8s_accepted])

    @property
    def apiserver_inputs(self) -> str:
        """What kube-apiserver loads (CAs, etcd CA, service account, its own settings)."""
        v1 = self.config.v1alpha1
        docs = [d for d in self.config.plain()
                if isinstance(d, dict) and d.get("kind") in _APISERVER_KINDS]
        return _hash(self.kubelet_inputs,
                     self.k8s_issuing.key_pem.decode() if self.k8s_issuing and self.k8s_issuing.key_pem else "",
                     self.aggregator_issuing.cert_pem.decode() if self.aggregator_issuing else "",
                     [c.decode() for c in self.aggregator_accepted],
                     self.etcd_ca.cert_pem.decode() if self.etcd_ca else "",
                     _plainish(_get(v1, "cluster", "apiServer")), _plainish(_get(v1, "cluster", "serviceAccount")),
                     docs)

    def fingerprints(self) -> dict[str, Any]:
        """Which CAs this configuration trusts and issues with (SHA-256 of each certificate, short)."""
        def fp(pem: bytes) -> str:
            return _pem.load_certificate(pem).fingerprint(_SHA256).hex()[:16]

        return {
            "os": {"issuing": fp(self.os_ca.signer_pem), "can_issue": self.os_ca.key_pem is not None,
                   "trusted": [fp(c) for c in self.os_trust]},
            "kubernetes": {"issuing": fp(self.k8s_issuing.signer_pem) if self.k8s_issuing else None,
                           "trusted": [fp(c) for c in self.k8s_accepted]},
            "aggregator": {"issuing": fp(self.aggregator_issuing.signer_pem) if self.aggregator_issuing else None,
                           "trusted": [fp(c) for c in self.aggregator_accepted]},
            "etcd": {"issuing": fp(self.etcd_ca.signer_pem) if self.etcd_ca else None,
                     "trusted": [fp(c) for c in self.etcd_ca.certificates] if self.etcd_ca else []},
        }


def _plainish(node: Any) -> Any:
    return json.loads(json.dumps(node, default=str)) if node is not None else None


_APISERVER_KINDS = {"KubeAPIServerConfig", "KubeAuthenticationConfig", "KubeAdmissionControlConfig",
                    "KubeAuditPolicyConfig", "KubeAuthorizerConfig", "KubeServiceAccountConfig",
                    "KubeAggregatorCAConfig", "KubeAPIServerCAConfig", "KubeEtcdEncryptionConfig"}

_SHA256 = _hashes.SHA256()


def _pem_list(values: Any, what: str, problems: list[str]) -> list[bytes]:
    out: list[bytes] = []
    if values is None:
        return out
    if not isinstance(values, list):
        problems.append(f"{what} must be a list")
        return out
    for i, v in enumerate(values):
        data = v.encode() if isinstance(v, str) else None
        cert = _cert(data, f"{what}[{i}]", problems) if data else None
        if data is None:
            problems.append(f"{what}[{i}] must be a PEM string")
        if cert:
            out.append(cert)
    return out


def _k8s_ca(cfg: MachineConfig, kind: str, legacy_ca: str, legacy_accepted: str | None,
            problems: list[str]) -> tuple[CAView | None, tuple[bytes, ...]]:
    v1 = cfg.v1alpha1
    doc = cfg.find(kind)
    legacy = _get(v1, "cluster", legacy_ca)
    if doc is not None:
        if legacy not in (None, {}) and (_get(legacy, "crt") or _get(legacy, "key")):
            problems.append(f"{kind} conflicts with cluster.{legacy_ca} in the v1alpha1 document")
        issuing = None
        cert = _get(doc, "issuingCA", "cert")
        if cert:
            crt = _cert(str(cert).encode(), f"{kind}.issuingCA.cert", problems)
            key = _key(str(_get(doc, "issuingCA", "key") or "").encode(), f"{kind}.issuingCA.key", problems)
            if crt:
                issuing = CAView(crt, key)
        accepted = _pem_list(_get(doc, "acceptedCAs"), f"{kind}.acceptedCAs", problems)
    else:
        issuing = None
        crt = _cert(_b64(_get(legacy, "crt"), f"cluster.{legacy_ca}.crt", problems, required=False),
                    f"cluster.{legacy_ca}.crt", problems)
        if crt:
            key = _key(_b64(_get(legacy, "key"), f"cluster.{legacy_ca}.key", problems, required=False),
                       f"cluster.{legacy_ca}.key", problems)
            issuing = CAView(crt, key)
        accepted = []
        if legacy_accepted:
            for i, entry in enumerate(_get(v1, "cluster", legacy_accepted) or []):
                c = _cert(_b64(_get(entry, "crt"), f"cluster.{legacy_accepted}[{i}].crt", problems),
                          f"cluster.{legacy_accepted}[{i}].crt", problems)
                if c:
                    accepted.append(c)
    # The issuing certificate is always accepted (first, as Talos's shim orders it).
    if issuing is not None:
        accepted = [issuing.signer_pem, *[a for a in accepted if a != issuing.signer_pem]]
    return (issuing if issuing and issuing.key_pem else None), tuple(accepted)


def read_config(cfg: MachineConfig) -> ConfigView:
    """Validate and read a configuration; raises ConfigInvalidError listing every problem."""
    problems: list[str] = []
    try:
        v1 = cfg.v1alpha1
    except KeyError:
        raise ConfigInvalidError(["the configuration has no v1alpha1 document"]) from None
    mtype = _get(v1, "machine", "type")
    if mtype not in MACHINE_TYPES:
        problems.append(f"machine.type {mtype!r} is not one of controlplane, worker")
    token = _get(v1, "machine", "token")
    if not token:
        problems.append("machine.token is required")
    crt = _cert(_b64(_get(v1, "machine", "ca", "crt"), "machine.ca.crt", problems), "machine.ca.crt", problems)
    key = _key(_b64(_get(v1, "machine", "ca", "key"), "machine.ca.key", problems, required=False),
               "machine.ca.key", problems)
    if mtype in ("controlplane", "init") and crt and not key:
        problems.append("machine.ca.key is required on a control plane")
    accepted = []
    for i, entry in enumerate(_get(v1, "machine", "acceptedCAs") or []):
        c = _cert(_b64(_get(entry, "crt"), f"machine.acceptedCAs[{i}].crt", problems),
                  f"machine.acceptedCAs[{i}].crt", problems)
        if c:
            accepted.append(c)
    k8s_issuing, k8s_accepted = _k8s_ca(cfg, "KubeAPIServerCAConfig", "ca", "acceptedCAs", problems)
    agg_issuing, agg_accepted = _k8s_ca(cfg, "KubeAggregatorCAConfig", "aggregatorCA", None, problems)
    etcd = None
    etcd_crt = _cert(_b64(_get(v1, "cluster", "etcd", "ca", "crt"), "cluster.etcd.ca.crt", problems,
                          required=mtype in ("controlplane", "init")), "cluster.etcd.ca.crt", problems)
    if etcd_crt:
        etcd_key = _key(_b64(_get(v1, "cluster", "etcd", "ca", "key"), "cluster.etcd.ca.key", problems,
                             required=mtype in ("controlplane", "init")), "cluster.etcd.ca.key", problems)
        etcd = CAView(etcd_crt, etcd_key)
    if not k8s_accepted:
        problems.append("no Kubernetes CA: set KubeAPIServerCAConfig or cluster.ca")
    kcc = cfg.find("KubeClusterConfig")
    endpoint = str(_get(kcc, "endpoint") or _get(v1, "cluster", "controlPlane", "endpoint") or "")
    name = str(_get(kcc, "clusterName") or _get(v1, "cluster", "clusterName") or "")
    if problems:
        raise ConfigInvalidError(problems)
    assert crt is not None  # narrowed: a missing machine.ca.crt is a problem above
    hostname = _get(cfg.find("HostnameConfig"), "hostname") or _get(v1, "machine", "network", "hostname")
    return ConfigView(cfg, str(mtype), str(token), CAView(crt, key), tuple(accepted),
                      k8s_issuing, k8s_accepted, agg_issuing, agg_accepted, etcd, endpoint, name,
                      str(hostname) if hostname else None)
