"""What applying a configuration change to a running Talos node takes (docs/decisions.md#config-rollout and its
amendment).

Talos does not say whether a change needs a reboot (v1.14 applies everything without one, and then
some settings only take effect at the next boot; <= 1.13 refuses NO_REBOOT for what its
``CanApplyImmediate`` list lacks), and ichord has to know before the apply: so the knowledge is
here, as one table of ordered rules per version contract (Talos's API definitions). The first rule
whose document kind and path prefix match a changed field decides; a document added or removed
whole is classified by every field it carries and reported once, as the document.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ichord.contract import V1_13, V1_14, UnsupportedContractError, VersionContract
from ichord.errors import IchordError
from ichord.render.config import V1ALPHA1, MachineConfig
from ichord.render.diff import Change, FieldPath, Op, diff

__all__ = [
    "CONTROLPLANE",
    "TABLES",
    "WORKER",
    "Change",
    "Classification",
    "ClassifiedChange",
    "FieldmetaError",
    "Impact",
    "Rule",
    "UnsupportedChange",
    "classify",
    "classify_changes",
    "diff",
    "normalize_role",
    "summarize_paths",
]

CONTROLPLANE = "controlplane"
WORKER = "worker"
# Talos's legacy spellings of the two roles ("init" is a control plane, "join" a worker).
_ROLE_ALIASES = {"controlplane": CONTROLPLANE, "init": CONTROLPLANE, "worker": WORKER, "join": WORKER}


class FieldmetaError(IchordError):
    pass


class Impact(enum.Enum):
    """Ordered from harmless to impossible; ``Classification.worst`` picks the last one present."""

    SAFE = "safe"
    INSTALL_TIME_ONLY = "install-time-only"
    API_SERVER_RESTART = "api-server-restart"
    REBOOT = "reboot"
    UNSUPPORTED = "unsupported"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {impact: i for i, impact in enumerate(Impact)}


def normalize_role(role: str) -> str:
    """``controlplane`` or ``worker`` (Talos's ``init``/``join`` accepted); anything else is refused."""
    try:
        return _ROLE_ALIASES[str(role).strip().lower()]
    except KeyError:
        raise FieldmetaError(f"unknown machine role {role!r}: use controlplane or worker") from None


# ---- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleContext:
    old: MachineConfig
    new: MachineConfig
    change: Change
    role: str


Predicate = Callable[[RuleContext], bool]


@dataclass(frozen=True)
class Rule:
    """``kinds`` None matches every document, TYPED every document but v1alpha1."""

    impact: Impact
    kinds: frozenset[str] | None
    prefix: tuple[str, ...]
    reason: str
    #: Set for rules about control-plane components: on a worker the change applies like a safe one.
    worker_reason: str | None = None
    when: Predicate | None = None

    def matches(self, kind: str, path: FieldPath, ctx: RuleContext) -> bool:
        if self.kinds is not None:
            if TYPED in self.kinds:
                if kind == V1ALPHA1:
                    return False
            elif kind not in self.kinds:
                return False
        if tuple(path[: len(self.prefix)]) != self.prefix:
            return False
        return self.when is None or self.when(ctx)

    def decide(self, role: str) -> tuple[Impact, str]:
        if role == WORKER and self.worker_reason is not None:
            return Impact.SAFE, self.worker_reason
        return self.impact, self.reason


TYPED = "<typed>"


def _v1(dotted: str, impact: Impact, reason: str, **kw: Any) -> Rule:
    """A rule on the v1alpha1 document: ``.cluster.etcd`` -> prefix ("cluster", "etcd")."""
    prefix = tuple(p for p in dotted.split(".") if p)
    return Rule(impact, frozenset({V1ALPHA1}), prefix, reason, **kw)


def _v1_each(dotted_paths: str, impact: Impact, reason: str, **kw: Any) -> tuple[Rule, ...]:
    """One rule per space-separated path, in the order written."""
    return tuple(_v1(p, impact, reason, **kw) for p in dotted_paths.split())


def _docs(kinds: str, impact: Impact, reason: str, prefix: str = "", **kw: Any) -> Rule:
    """A rule on typed documents: ``"KernelModuleConfig"`` or several kinds separated by spaces."""
    return Rule(impact, frozenset(kinds.split()), tuple(p for p in prefix.split(".") if p), reason, **kw)


def _machine_type(config: MachineConfig) -> str | None:
    try:
        value = (config.v1alpha1.get("machine") or {}).get("type")
    except KeyError:
        return None
    return _ROLE_ALIASES.get(str(value).lower()) if value is not None else None


def _role_changes(ctx: RuleContext) -> bool:
    return _machine_type(ctx.old) != _machine_type(ctx.new)


def _identity(config: MachineConfig) -> tuple[Any, Any]:
    """The discovery identity: DiscoveryIdentityConfig if present, else the legacy ``.cluster.id/secret``."""
    doc = config.find("DiscoveryIdentityConfig")
    if doc is not None:
        return doc.get("clusterID"), doc.get("clusterSecret")
    try:
        cluster = config.v1alpha1.get("cluster") or {}
    except KeyError:
        return None, None
    return cluster.get("id"), cluster.get("secret")


def _identity_changes(ctx: RuleContext) -> bool:
    # Moving the same identity between the legacy fields and the document is no change of cluster.
    return _identity(ctx.old) != _identity(ctx.new)


def _document(op: Op) -> Predicate:
    return lambda ctx: ctx.change.whole_document and ctx.change.op is op


_SAFE, _INSTALL, _API, _REBOOT, _UNSUP = (
    Impact.SAFE,
    Impact.INSTALL_TIME_ONLY,
    Impact.API_SERVER_RESTART,
    Impact.REBOOT,
    Impact.UNSUPPORTED,
)

_NO_APISERVER = "a worker runs no kube-apiserver: applied like a safe change"
_NO_ETCD = "a worker runs no etcd: applied like a safe change"
_ETCD = "etcd reads its image, arguments, addresses and CA only when it starts, and Talos never restarts it"
_APISERVER = "re-renders the kube-apiserver static pod: kube-apiserver restarts (15-45 s without /readyz)"
_K8S_SECRETS = "feeds the Kubernetes secrets kube-apiserver loads (talos.dev/secrets-version): kube-apiserver restarts"
_CA = "CA material: applied on purpose by the CA rotation, which verifies its effect"
_K8S_CA = ("a Kubernetes or aggregator CA: kube-apiserver restarts to load it (the CA rotation applies it one control "
           "plane at a time; otherwise a config operation does)")
_K8S_CA_WORKER = "a worker runs no kube-apiserver (its kubelet restarts): applied like a safe change"
_INSTALLER = "read only by the installer: no effect on an installed node, not even after a reboot"
_IDENTITY = (
    "the discovery identity (cluster ID and secret) changed: that is another cluster; reset the machine "
    "and join it to that cluster instead"
)

_V1ALPHA1_REMOVED = (
    "the v1alpha1 document would be removed: Talos refuses a configuration without it outside "
    "maintenance mode; restore it (check the patches)"
)
_V1ALPHA1_ADDED = (
    "the node's configuration has no v1alpha1 document, which a configured Talos node always has: "
    "compare against the node's whole configuration"
)
_ROLE = (
    "a machine cannot change between control plane and worker while it runs: reset it and join it "
    "again with the new role"
)

#: Rules both contracts share, ahead of each contract's own; order matters (first match wins).
_COMMON: tuple[Rule, ...] = (
    # Changes no running node can take.
    _v1("", _UNSUP, _V1ALPHA1_REMOVED, when=_document(Op.REMOVED)),
    _v1("", _UNSUP, _V1ALPHA1_ADDED, when=_document(Op.ADDED)),
    _v1(".machine.type", _UNSUP, _ROLE, when=_role_changes),
    _v1(".cluster.id", _UNSUP, _IDENTITY, when=_identity_changes),
    _v1(".cluster.secret", _UNSUP, _IDENTITY, when=_identity_changes),
    _docs("DiscoveryIdentityConfig", _UNSUP, _IDENTITY, when=_identity_changes),
    # etcd: only at start. Its CA (.cluster.etcd.ca) too; docs/decisions.md#ca-rotation-passes rolls it by reboot.
    _v1(".cluster.etcd", _REBOOT, _ETCD, worker_reason=_NO_ETCD),
    # Install configuration.
    _v1(".machine.install", _INSTALL, _INSTALLER),
    _docs("UnattendedInstallConfig UnattendedInstall", _INSTALL, _INSTALLER),
    # Applied, but only takes effect at the next boot.
    _v1(".machine.env", _REBOOT, "services already running keep their environment until they restart"),
    _docs("EnvironmentConfig", _REBOOT, "services already running keep their environment until they restart"),
    # Loading is live, but removal and parameter changes are not; docs/decisions.md#config-rollout reports additions
    # too.
    _v1(".machine.kernel.modules", _REBOOT, "kernel modules are not unloaded or re-parametrised on a running node"),
    _docs("KernelModuleConfig", _REBOOT, "kernel modules are not unloaded or re-parametrised on a running node"),
    _v1(".machine.systemDiskEncryption", _REBOOT, "volume encryption keys are used when a volume is opened at boot"),
    _docs(
        "VolumeConfig UserVolumeConfig RawVolumeConfig SwapVolumeConfig",
        _REBOOT,
        "volume encryption keys are used when a volume is opened at boot",
        prefix="encryption",
    ),
    # CA material. apid reloads its certificates: the Talos CA is SAFE. The Kubernetes and aggregator CAs
    # re-render kube-apiserver's secrets, so on a control plane they restart it: outside a rotation (an
    # abandoned one leaves the new CAs accepted on the nodes) the machine reconciler reports them and a
    # `config` operation applies them one control plane at a time (issue 17). The CA rotation applies them
    # itself, stage by stage, one kube-apiserver restart at a time (docs/decisions.md#rotation-state,
    # docs/decisions.md#ca-rotation-passes), while the reconciler stands aside.
    _v1(".machine.ca", _SAFE, _CA),
    _v1(".machine.acceptedCAs", _SAFE, _CA),
    _v1(".cluster.ca", _API, _K8S_CA, worker_reason=_K8S_CA_WORKER),
    _v1(".cluster.acceptedCAs", _API, _K8S_CA, worker_reason=_K8S_CA_WORKER),
    _v1(".cluster.aggregatorCA", _API, _K8S_CA, worker_reason=_K8S_CA_WORKER),
    _docs("KubeAPIServerCAConfig KubeAggregatorCAConfig", _API, _K8S_CA, worker_reason=_K8S_CA_WORKER),
    # docs/decisions.md#config-rollout's amendment: kube-apiserver's static pod and the config files it sums into its
    # version.
    _v1(".cluster.apiServer", _API, _APISERVER, worker_reason=_NO_APISERVER),
    _docs(
        "KubeAPIServerConfig KubeAuthenticationConfig KubeAdmissionControlConfig KubeAuditPolicyConfig "
        "KubeAuthorizerConfig",
        _API,
        _APISERVER,
        worker_reason=_NO_APISERVER,
    ),
    # The other inputs of Talos's Kubernetes root secrets (KubernetesRootSpec: name, endpoint, local
    # endpoint, service IPs, DNS domain, service-account key, encryption secrets): kube-apiserver
    # reloads them by restarting, so they must not land on every control plane at once either.
    *_v1_each(
        ".cluster.clusterName .cluster.controlPlane .cluster.network.dnsDomain .cluster.network.serviceSubnets "
        ".cluster.serviceAccount .cluster.secretboxEncryptionSecret .cluster.aescbcEncryptionSecret",
        _API,
        _K8S_SECRETS,
        worker_reason=_NO_APISERVER,
    ),
    _docs(
        "KubeClusterConfig KubeServiceAccountConfig KubeEtcdEncryptionConfig",
        _API,
        _K8S_SECRETS,
        worker_reason=_NO_APISERVER,
    ),
    _docs("KubeNetworkConfig", _API, _K8S_SECRETS, prefix="dnsDomain", worker_reason=_NO_APISERVER),
    _docs("KubeNetworkConfig", _API, _K8S_SECRETS, prefix="serviceSubnets", worker_reason=_NO_APISERVER),
)

_IMMEDIATE_113 = "in Talos 1.13's list of changes applied immediately (CanApplyImmediate)"

#: v1.13 (CanApplyImmediate at v1.13.9): these v1alpha1 subtrees and every other document apply
#: immediately; the rest of v1alpha1 (.machine.token, .machine.type, .persist, ...) needs a reboot.
_V1_13_IMMEDIATE_PATHS = (
    ".debug .cluster .machine.ca .machine.acceptedCAs .machine.time .machine.certSANs .machine.network "
    ".machine.sysfs .machine.sysctls .machine.logging .machine.controlPlane .machine.kubelet .machine.kernel "
    ".machine.registries .machine.pods .machine.seccompProfiles .machine.nodeAnnotations .machine.nodeLabels "
    ".machine.nodeTaints .machine.features.kubernetesTalosAPIAccess .machine.features.kubePrism "
    ".machine.features.hostDNS .machine.features.imageCache .machine.features.nodeAddressSortAlgorithm"
)
_V1_13_IMMEDIATE: tuple[Rule, ...] = (
    *_v1_each(_V1_13_IMMEDIATE_PATHS, _SAFE, _IMMEDIATE_113),
    Rule(_SAFE, frozenset({TYPED}), (), "documents other than v1alpha1 apply immediately in Talos 1.13"),
    Rule(_REBOOT, None, (), "not in Talos 1.13's list of changes applied immediately: NO_REBOOT refuses it"),
)

TABLES: Mapping[VersionContract, tuple[Rule, ...]] = {
    V1_13: (*_COMMON, *_V1_13_IMMEDIATE),
    # v1.14 applies every configuration without a reboot; what needs one is in _COMMON.
    V1_14: (*_COMMON, Rule(_SAFE, None, (), "Talos 1.14 applies it to the running node")),
}


# ---- classification --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassifiedChange:
    change: Change
    impact: Impact
    reason: str

    @property
    def path(self) -> str:
        return self.change.label


@dataclass(frozen=True)
class UnsupportedChange:
    path: str
    reason: str


@dataclass(frozen=True)
class Classification:
    contract: VersionContract
    role: str
    changes: tuple[ClassifiedChange, ...]  # in diff order

    @property
    def has_changes(self) -> bool:
        return bool(self.changes)

    @property
    def worst(self) -> Impact:
        """The most disruptive impact present; SAFE when nothing changed."""
        return max((c.impact for c in self.changes), key=lambda i: i.rank, default=Impact.SAFE)

    @property
    def by_impact(self) -> dict[Impact, tuple[ClassifiedChange, ...]]:
        return {impact: tuple(c for c in self.changes if c.impact is impact) for impact in Impact}

    def paths(self, impact: Impact) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes if c.impact is impact)

    @property
    def safe_paths(self) -> tuple[str, ...]:
        return self.paths(Impact.SAFE)

    @property
    def reboot_paths(self) -> tuple[str, ...]:
        return self.paths(Impact.REBOOT)

    @property
    def api_server_restart_paths(self) -> tuple[str, ...]:
        return self.paths(Impact.API_SERVER_RESTART)

    @property
    def install_time_paths(self) -> tuple[str, ...]:
        return self.paths(Impact.INSTALL_TIME_ONLY)

    @property
    def unsupported(self) -> tuple[UnsupportedChange, ...]:
        return tuple(UnsupportedChange(c.path, c.reason) for c in self.changes if c.impact is Impact.UNSUPPORTED)


def table_for(contract: VersionContract) -> tuple[Rule, ...]:
    try:
        return TABLES[contract]
    except KeyError:
        supported = ", ".join(str(c) for c in TABLES)
        raise UnsupportedContractError(
            f"no change classification for Talos {contract}; ichord classifies {supported}"
        ) from None


def classify(old: MachineConfig, new: MachineConfig, contract: VersionContract, role: str) -> Classification:
    """Classify every change from ``old`` (what the node runs) to ``new`` (what it should run)."""
    return classify_changes(old, new, diff(old, new), contract, role)


def classify_changes(
    old: MachineConfig, new: MachineConfig, changes: Sequence[Change], contract: VersionContract, role: str
) -> Classification:
    table = table_for(contract)
    role = normalize_role(role)
    out = []
    for change in changes:
        ctx = RuleContext(old, new, change, role)
        # A whole document is judged by the document itself and by every field it carries.
        probes = [change.path, *change.leaves] if change.whole_document else [change.path]
        impact, reason = max(
            (_decide(table, change.kind, probe, ctx, role) for probe in probes), key=lambda d: d[0].rank
        )
        out.append(ClassifiedChange(change, impact, reason))
    return Classification(contract, role, tuple(out))


def _decide(table: Sequence[Rule], kind: str, path: FieldPath, ctx: RuleContext, role: str) -> tuple[Impact, str]:
    for rule in table:
        if rule.matches(kind, path, ctx):
            return rule.decide(role)
    # Every table ends with catch-all rules; reaching here is a bug in the table, so be cautious.
    return Impact.REBOOT, "no classification rule matched"


def summarize_paths(paths: Sequence[str], limit: int = 5) -> str:
    """``fields: a, b, c, d, e, and 3 more`` (for condition messages; paths never carry values)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if not paths:
        return "no fields"
    shown = ", ".join(paths[:limit])
    rest = len(paths) - limit
    return f"fields: {shown}, and {rest} more" if rest > 0 else f"fields: {shown}"
