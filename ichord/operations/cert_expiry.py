"""The CA expiry pass (docs/decisions.md#expiry-alerting; docs/decisions.md#credentials-handoff).

Per cluster: read the bundle Secret uncached, publish each CA's notAfter in
``TalosCluster.status.certificates`` and as ``ichord_certificate_expiry_timestamp_seconds``, keep the
``CertificatesExpiring`` condition, and lower ``BundleBackupStale`` once the live bundle was exported.
Only ``status.certificates`` and those two conditions are written, and only when they change, so an
idle daemon does not write hourly. An unreadable bundle fails nothing and is retried after
``Timing.expiry_retry``; nothing read from the Secret ever reaches a message or a log line.

The pass must run inside the cluster's actor: it is serialised with the ca-rotation there, which is
what keeps it from lowering a BundleBackupStale the rotation raised after this pass read the bundle.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ichord.api.conditions import Condition, find, now_rfc3339, set_condition
from ichord.api.names import (
    BUNDLE_BACKUP_STALE,
    BUNDLE_EXPORTED_ANNOTATION,
    CERTIFICATES_EXPIRING,
    READY,
    BundleBackupStaleReason,
    CertificatesExpiringReason,
    EventReason,
    ReadyReason,
)
from ichord.errors import IchordError
from ichord.kube.client import KubeClient
from ichord.kube.crds import clusters
from ichord.kube.errors import KubeError, NotFound
from ichord.kube.events import WARNING, EventRecorder, ObjectRef
from ichord.kube.status import StatusMutation, update_status
from ichord.metrics import CERTIFICATE_EXPIRY
from ichord.operations.bundle_source import BundleRead, BundleSourceError, read_bundle_secret
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import ca_fingerprint, export_fingerprint
from ichord.pki.scrub import scrub_text
from ichord.pki.targets import in_certificate_order
from ichord.settings import SettingsError, Timing

log = structlog.get_logger(__name__)

Obj = dict[str, Any]

DEFAULT_WARNING_DAYS = 90


# ---- the pure decision ------------------------------------------------------------------------


@dataclass(frozen=True)
class CertificateExpiry:
    """One CA of the bundle as status shows it: name, notAfter, SHA-256 fingerprint of the certificate."""

    name: str
    not_after: dt.datetime
    fingerprint: str

    @property
    def not_after_rfc3339(self) -> str:
        return now_rfc3339(self.not_after)

    def as_status(self) -> dict[str, str]:
        return {"name": self.name, "notAfter": self.not_after_rfc3339, "fingerprint": self.fingerprint}


@dataclass(frozen=True)
class ExpiryResult:
    certificates: tuple[CertificateExpiry, ...]
    #: Inside the warning window and not yet expired / already expired.
    expiring: tuple[CertificateExpiry, ...]
    expired: tuple[CertificateExpiry, ...]
    condition: Condition

    def status_certificates(self) -> list[dict[str, str]]:
        return [c.as_status() for c in self.certificates]


def certificate_expiries(bundle: SecretsBundle) -> tuple[CertificateExpiry, ...]:
    return tuple(
        CertificateExpiry(t.name, bundle.ca(t.ca_kind).not_after, ca_fingerprint(bundle.ca(t.ca_kind)))
        for t in in_certificate_order()  # status.certificates' order; the names are the rotation targets'
        if bundle.holds(t.ca_kind)  # a target's CA kept beside Talos's four is published once the bundle has it
    )


def expiry_status(bundle: SecretsBundle, now: dt.datetime, warning_days: float, *,
                  cluster: tuple[str, str] = ("NS", "NAME")) -> ExpiryResult:
    """status.certificates and the CertificatesExpiring condition for ``bundle`` at ``now``; ``cluster`` is
    (namespace, name), for the commands the message names.

    The message names CAs and UTC dates, never days left, so it changes only when the bundle does
    (or once, when a CA crosses into the window or expires).
    """
    if warning_days < 0:
        raise SettingsError(f"--certificate-expiry-warning-days must be 0 or more, got {warning_days:g}")
    certs = certificate_expiries(bundle)
    horizon = now + dt.timedelta(days=warning_days)
    expired = tuple(c for c in certs if c.not_after <= now)
    expiring = tuple(c for c in certs if now < c.not_after <= horizon)
    window = f"the {warning_days:g}-day warning window"
    if not expired and not expiring:
        earliest = min(certs, key=lambda c: c.not_after)
        cond = Condition(
            CERTIFICATES_EXPIRING, "False", CertificatesExpiringReason.NOT_EXPIRING,
            f"No CA expires within {window}; the earliest is {earliest.name} on {earliest.not_after_rfc3339}.")
        return ExpiryResult(certs, expiring, expired, cond)
    named = [f"{c.name} expired on {c.not_after_rfc3339}" for c in expired]
    named += [f"{c.name} expires on {c.not_after_rfc3339}" for c in expiring]
    targets = ", ".join(c.name for c in certs if c in expired or c in expiring)
    reason = CertificatesExpiringReason.EXPIRED if expired else CertificatesExpiringReason.EXPIRING
    ns, name = cluster
    message = (f"CAs expired or expiring within {window}: {'; '.join(named)}. Rotate them: "
               f"`ichord cluster rotate {name} -n {ns} --targets {targets.replace(', ', ',')}`, then save the new "
               f"bundle with `ichord cluster bundle-export {name} -n {ns}`.")
    return ExpiryResult(certs, expiring, expired, Condition(CERTIFICATES_EXPIRING, "True", reason, message))


def exported_fingerprint(cluster_obj: Obj) -> str | None:
    annotations = (cluster_obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(BUNDLE_EXPORTED_ANNOTATION)
    return str(value) if value else None


def backup_stale_lowered(cluster_obj: Obj, bundle: SecretsBundle) -> bool:
    """True when the export annotation names the live bundle (docs/decisions.md#credentials-handoff: ExportFingerprint).

    An export of the pre-rotation bundle carries the old fingerprint and does not count.
    """
    return exported_fingerprint(cluster_obj) == export_fingerprint(bundle)


def backup_current_condition(bundle: SecretsBundle) -> Condition:
    return Condition(
        BUNDLE_BACKUP_STALE, "False", BundleBackupStaleReason.BUNDLE_EXPORTED,
        f"The live secrets bundle was exported (ExportFingerprint {export_fingerprint(bundle)}); the saved "
        f"copy matches the CAs in the cluster's Secret.")


def bundle_mismatched(status: Obj) -> bool:
    """Whether the cluster's Ready says its bundle is not the one its nodes trust (docs/decisions.md#bundle-belongs):
    then no saved copy is said to match the Secret."""
    ready = find(status.get("conditions"), READY)
    return ready is not None and ready.get("reason") == ReadyReason.BUNDLE_MISMATCH


def backup_condition(obj: Obj, bundle: SecretsBundle, mismatch: bool) -> Condition | None:
    """BundleBackupStale as a change of the bundle's standing makes it (None: leave it as it is).

    ``mismatch``: the nodes do not trust the bundle (Ready BundleMismatch). While it holds, an existing condition
    is Unknown, since the saved copy is compared with what the nodes run, not only with the
    Secret; once it ends, a condition it had set says again whether the export names the live bundle. A cluster
    that never had the condition gets none."""
    stale = find(((obj.get("status") or {}).get("conditions")), BUNDLE_BACKUP_STALE)
    if stale is None:
        return None
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace") or "NS", meta.get("name") or "NAME"
    if mismatch:
        return Condition(
            BUNDLE_BACKUP_STALE, "Unknown", BundleBackupStaleReason.BUNDLE_MISMATCH,
            f"The cluster's Secret holds a bundle its nodes do not trust (Ready BundleMismatch names the CAs' "
            f"fingerprints); no saved copy is compared with it. Keep the copy you saved and put it back in the "
            f"Secret (the TalosCluster's Ready says how); `ichord cluster bundle-export {name} -n {namespace}` "
            f"refuses to export until then.")
    if stale.get("reason") != BundleBackupStaleReason.BUNDLE_MISMATCH:
        return None
    if backup_stale_lowered(obj, bundle):
        return backup_current_condition(bundle)
    return Condition(
        BUNDLE_BACKUP_STALE, "True", BundleBackupStaleReason.NOT_EXPORTED,
        f"The bundle in the cluster's Secret is the one its nodes trust again, and the export annotation "
        f"({BUNDLE_EXPORTED_ANNOTATION}) names another bundle: save this one with "
        f"`ichord cluster bundle-export {name} -n {namespace}`.")


def backup_mutation(bundle: SecretsBundle, mismatch: bool, now: dt.datetime) -> StatusMutation:
    """``backup_condition`` as a change of the status being written (None: nothing to change)."""
    def mutate(status: Obj, obj: Obj) -> Obj | None:
        cond = backup_condition({**obj, "status": status}, bundle, mismatch)
        if cond is None or _same(find(status.get("conditions"), BUNDLE_BACKUP_STALE), cond):
            return None
        status["conditions"] = set_condition(status.get("conditions"), cond, now=now)
        return status

    return mutate


def wants_expiry_pass(old: Obj | None, new: Obj) -> bool:
    """Whether a TalosCluster change should run a pass now rather than at the hourly re-read.

    An export annotation written by ``bundle-export`` or a changed secretsRef would otherwise wait
    up to an hour to show.
    """
    if old is None:
        return True
    return (exported_fingerprint(old) != exported_fingerprint(new)
            or _secret_name(old) != _secret_name(new))


# ---- the pass against the API -----------------------------------------------------------------


def _secret_name(cluster_obj: Obj) -> str | None:
    ref = (cluster_obj.get("spec") or {}).get("secretsRef") or {}
    name = ref.get("name")
    return str(name) if name else None


def publish_metrics(namespace: str, name: str, result: ExpiryResult) -> None:
    for cert in result.certificates:
        CERTIFICATE_EXPIRY.set((namespace, name, cert.name), cert.not_after.timestamp())


def forget_cluster(namespace: str, name: str) -> None:
    """Drop a deleted cluster's expiry series (docs/decisions.md#expiry-alerting)."""
    for target in in_certificate_order():
        CERTIFICATE_EXPIRY.remove((namespace, name, target.name))


@dataclass
class _Written:
    turned_true: bool = False
    lowered: bool = False


def _same(old: Obj | None, cond: Condition) -> bool:
    return (old is not None and old.get("status") == cond.status and old.get("reason") == cond.reason
            and old.get("message") == scrub_text(cond.message))


def _mutation(result: ExpiryResult, bundle: SecretsBundle, now: dt.datetime,
              written: _Written) -> Callable[[Obj, Obj], Obj | None]:
    def mutate(status: Obj, obj: Obj) -> Obj | None:
        written.turned_true = written.lowered = False
        conditions: list[Obj] | None = status.get("conditions")
        changed = False
        certificates = result.status_certificates()
        if status.get("certificates") != certificates:
            status["certificates"] = certificates
            changed = True
        # The EXPIRES printer column (kubectl get tc): the earliest notAfter of the cluster's CAs.
        earliest = min((c.not_after for c in result.certificates), default=None)
        if earliest is not None and status.get("earliestExpiry") != now_rfc3339(earliest):
            status["earliestExpiry"] = now_rfc3339(earliest)
            changed = True
        old = find(conditions, CERTIFICATES_EXPIRING)
        if not _same(old, result.condition):
            conditions = set_condition(conditions, result.condition, now=now)
            changed = True
            written.turned_true = result.condition.status == "True" and (old is None or old.get("status") != "True")
        stale = find(conditions, BUNDLE_BACKUP_STALE)
        # Raised only by the rotation; lowered here, against the annotation of the object being written, and never
        # while the nodes do not trust the Secret's bundle (an export of that bundle is no backup of the cluster).
        if (stale is not None and stale.get("status") == "True" and backup_stale_lowered(obj, bundle)
                and not bundle_mismatched(status)):
            conditions = set_condition(conditions, backup_current_condition(bundle), now=now)
            changed = written.lowered = True
        if not changed:
            return None
        status["conditions"] = conditions
        return status

    return mutate


def _then(first: StatusMutation, second: StatusMutation) -> StatusMutation:
    """``first`` then ``second`` on the same status (None from both: nothing to change)."""
    def mutate(status: Obj, obj: Obj) -> Obj | None:
        after_first = first(status, obj)
        after_second = second(status if after_first is None else after_first, obj)
        return after_second if after_second is not None else after_first

    return mutate


async def expiry_pass(
    kube: KubeClient,
    cluster_obj: Obj,
    *,
    namespace_of_secret: str,
    recorder: EventRecorder,
    timing: Timing,
    warning_days: float = DEFAULT_WARNING_DAYS,
    now: dt.datetime | None = None,
    bundle: Callable[[], Awaitable[BundleRead]] | None = None,
    on_written: Callable[[Obj], None] | None = None,
    also: StatusMutation | None = None,
) -> float:
    """One expiry read of a cluster; returns the seconds until the next one.

    ``timing.expiry_reread`` after a read, ``timing.expiry_retry`` when the bundle could not be read
    or the status could not be written. Never raises for an API or bundle failure. ``on_written`` gets the
    cluster as the status write left it (or as read fresh when nothing changed), so the caller's next write
    of the same object starts from it instead of a GET. ``also`` is the caller's own change of the same status,
    decided in the same step, sent in this one write (the cluster actor's Ready): a cold cluster is written once,
    not twice; it goes only when the bundle was read (an unreadable bundle writes nothing here).
    """
    meta = cluster_obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    bound = log.bind(cluster=f"{namespace}/{name}")
    now = now or dt.datetime.now(dt.UTC)
    secret_name = _secret_name(cluster_obj) or ""
    try:
        read = await (bundle() if bundle is not None else read_bundle_secret(kube, namespace_of_secret, secret_name))
        public = read.public()  # the CA certificates only: expiry needs no key
    except IchordError as exc:
        # BundleSourceError (its reason is the type): only the typed message is logged, scrubbed.
        message = scrub_text(str(exc))
        kind = exc.reason if isinstance(exc, BundleSourceError) else type(exc).__name__
        bound.warning("bundle unreadable; expiry not published, retrying", error_type=kind,
                      error=message, retry_in=timing.expiry_retry)
        return timing.expiry_retry

    result = expiry_status(public, now, warning_days, cluster=(namespace, name))
    publish_metrics(namespace, name, result)
    written = _Written()
    mutation = _mutation(result, public, now, written)
    if also is not None:
        mutation = _then(mutation, also)
    try:
        # The caller's copy (the informer's) saves the read; a stale one costs a 409 and a fresh read, never an update.
        current = cluster_obj if (cluster_obj.get("metadata") or {}).get("resourceVersion") else None
        obj = await update_status(clusters(kube), namespace, name, mutation, current=current)
    except NotFound:
        bound.info("cluster gone before its expiry status was written")
        return timing.expiry_retry
    except KubeError as exc:
        bound.warning("expiry status not written; retrying", error=scrub_text(str(exc)),
                      retry_in=timing.expiry_retry)
        return timing.expiry_retry
    if on_written is not None:
        on_written(obj)
    if written.turned_true:
        recorder.record(ObjectRef.of(obj), WARNING, EventReason.CERTIFICATES_EXPIRING, result.condition.message)
        bound.warning("CAs expiring", certificates=[c.name for c in result.expired + result.expiring])
    if written.lowered:
        bound.info("BundleBackupStale lowered: the live bundle was exported")
    return timing.expiry_reread
