"""The operator's side of AwaitingCredentials (docs/decisions.md#credentials-handoff;
docs/decisions.md#credentials-handoff and "an early acknowledgement").

``hand_off`` finds the cluster's ca-rotation, waits until it reaches AwaitingCredentials, mints a
talosconfig and an admin kubeconfig from the new CAs, proves both work (Version on every control
plane with exactly that talosconfig; /version and the Nodes with exactly that kubeconfig), writes
them with mode 0600 and only then sets ``ichor.maesh.dev/credentials-handoff`` to the token. Every
API call goes through the transient-error retry (retry.py). Nothing secret is printed or raised.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.views import ClusterView, MachineSpecError, MachineView, OperationView
from ichord.credentials.files import earlier_hand_off
from ichord.credentials.mint import Minted, mint, talosconfig_dial
from ichord.credentials.retry import DEFAULT_DELAYS, Retrier
from ichord.errors import IchordError, RuntimeFailure
from ichord.kube import crds
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.errors import Forbidden, Invalid, KubeError, NotFound, TLSVerificationError, Unauthorized
from ichord.kube.reads import read_secret
from ichord.operations.ca_rotation.plan import handoff_token, hands_off, replaced_by
from ichord.pki.bundle import SecretsBundle
from ichord.pki.ca import CertificateAuthority
from ichord.pki.fingerprint import ca_fingerprint
from ichord.pki.rotation import Rotation, RotationError, Target, parse_targets
from ichord.pki.scrub import SCRUBBER
from ichord.safefile import check_destination, make_private_dirs, write_file
from ichord.talos.client import TalosClient
from ichord.talos.dial import DialBundle
from ichord.talos.errors import TalosError

T = TypeVar("T")
Obj = dict[str, Any]

#: Where the files go by default, next to ``ichor init``'s secrets.yaml (docs/decisions.md#bundle-backup-stale).
DEFAULT_CREDENTIALS_DIR = "~/.ichord/clusters/{name}"
TALOSCONFIG = "talosconfig"
KUBECONFIG = "kubeconfig"
_PAST = (Stage.ISSUING, Stage.DROPPING, Stage.FINALIZING, Stage.DONE)


class CredentialsError(IchordError):
    """The hand-off cannot go on; the message says why and what to do. Nothing was acknowledged."""


class NoRotationUnderWay(CredentialsError):
    """The cluster has no ca-rotation that is neither Completed nor Failed."""


class StageNotReached(CredentialsError, RuntimeFailure):
    """The rotation did not reach AwaitingCredentials within the wait (the command exits 1: try again later)."""


class CredentialsNotVerified(CredentialsError):
    """A minted credential was refused by the cluster; nothing was written, nothing acknowledged."""


@dataclass(frozen=True)
class HandOff:
    operation: str
    talosconfig: Path
    kubeconfig: Path
    token: str  # the new CAs' fingerprints: public
    stage: str  # the stage the credentials were made in
    acknowledged: bool
    talos_client_fingerprint: str
    kube_client_fingerprint: str


def _talos_client(dial: DialBundle) -> TalosClient:
    return TalosClient(dial, dial_timeout=10.0, rpc_timeout=30.0)


def _describe(exc: BaseException) -> str:
    """The typed error's own message, scrubbed (the cause chain adds only the raw HTTP exchange)."""
    return f"{type(exc).__name__}: {SCRUBBER.text(str(exc))}"


def _advice(exc: KubeError) -> str:
    if isinstance(exc, Unauthorized):
        return "The API server refused the kubeconfig's credentials: renew them or pass --kubeconfig."
    if isinstance(exc, Forbidden):
        return ("Your user lacks the permission: the hand-off reads TalosClusters, TalosMachines, TalosOperations "
                "and the bundle Secret, and patches the TalosOperation.")
    if isinstance(exc, NotFound):
        return "Check the name and --namespace."
    if isinstance(exc, Invalid):
        return "The API server refused the change as invalid."
    if isinstance(exc, TLSVerificationError):
        return "The kubeconfig does not trust the API server's certificate."
    return ""


async def _api(retry: Retrier, what: str, fn: Callable[[], Awaitable[T]]) -> T:
    """One management-API call: transient errors retried, a final one turned into a CredentialsError."""
    try:
        return await retry.call(what, fn)
    except KubeError as exc:
        raise CredentialsError(f"{what} failed: {_describe(exc)}. {_advice(exc)}".rstrip()) from None


def _stage(op: Obj) -> Stage | None:
    text = OperationView.of(op).stage
    try:
        return Stage.parse(text) if text else None
    except ValueError:
        return None


def _targets(op: Obj) -> tuple[Target, ...] | None:
    status = op.get("status") or {}
    names_ = ((status.get("caRotation") or {}).get("targets") or (status.get("plan") or {}).get("targets")
              or ((op.get("spec") or {}).get("caRotation") or {}).get("targets"))
    try:
        return parse_targets(list(names_) if names_ else None)
    except RotationError:
        return None  # the controller fails such an operation; the stage wait reports it


def _unfinished_rotation(op: Obj, cluster: str) -> bool:
    """A ca-rotation of ``cluster`` neither Completed nor Failed (started or not: the hand-off waits for it)."""
    view = OperationView.of(op)
    return view.kind == names.KIND_CA_ROTATION and view.cluster == cluster and view.unfinished


async def _find_operation(kube: KubeClient, retry: Retrier, namespace: str, cluster: str) -> Obj:
    items, _ = await _api(retry, f"listing the TalosOperations in {namespace}",
                          lambda: crds.operations(kube).list_objects(namespace))
    found = [op for op in items if _unfinished_rotation(op, cluster)]
    if not found:
        raise NoRotationUnderWay(
            f"no ca-rotation of TalosCluster {namespace}/{cluster} is under way (no TalosOperation of kind "
            f"{names.KIND_CA_ROTATION} for it that is neither Completed nor Failed); start the rotation first. "
            "Nothing was written.")
    # The cluster lock admits one rotation; should there be more, the one that has begun is the one waiting.
    found.sort(key=lambda op: (_stage(op) is None, str(op["metadata"].get("creationTimestamp") or "")))
    op = found[0]
    targets = _targets(op)
    if targets is not None and not hands_off(targets):
        raise CredentialsError(
            f"TalosOperation {namespace}/{op['metadata']['name']} rotates {', '.join(t.value for t in targets)} only: "
            "the operator's talosconfig and kubeconfig do not change, so there is no hand-off.")
    return op


def _held_by_a_person(op: Obj, cluster: str) -> str | None:
    """Why the rotation cannot reach the stage until a person acts (the command exits 1 at once), or None."""
    ns, name = str(op["metadata"]["namespace"]), str(op["metadata"]["name"])
    if (op.get("spec") or {}).get("paused"):
        return (f"TalosOperation {ns}/{name} is paused (spec.paused: true) and goes on only when that is set to "
                f"false: `kubectl -n {ns} patch talosoperation {name} --type merge -p "
                "'{\"spec\":{\"paused\":false}}'`, then run this command again. Nothing was written.")
    cond = OperationView.of(op).condition(names.CA_ROTATION) or {}
    if cond.get("reason") == names.CARotationReason.BUNDLE_RESTORE_REQUIRED:
        return (f"TalosOperation {ns}/{name} waits for its bundle Secret to be restored: run `ichord cluster "
                f"restore-bundle {cluster} -n {ns}` first, then this command again. Nothing was written.")
    return None


def _blocked(op: Obj) -> str | None:
    """The Blocked condition's message while the rotation is Blocked (the daemon retries its step), else None."""
    cond = OperationView.of(op).condition(names.CA_ROTATION) or {}
    if cond.get("reason") == names.CARotationReason.BLOCKED:
        return SCRUBBER.text(str(cond.get("message") or "no message"))
    return None


async def _await_stage(kube: KubeClient, retry: Retrier, op: Obj, *, wait: float, poll: float,
                       say: Callable[[str], None]) -> Obj:
    """Poll the operation until it is in AwaitingCredentials or later, saying what it waits for: once, and again
    when the rotation turns Blocked (with the reason). A rotation only a person can move on (paused, its bundle
    Secret to restore) is not waited for: StageNotReached at once, naming the command (exit 1)."""
    ns, name = str(op["metadata"]["namespace"]), str(op["metadata"]["name"])
    cluster = OperationView.of(op).cluster or ""
    deadline = time.monotonic() + wait
    said: str | None = None
    while True:
        status = op.get("status") or {}
        stage = _stage(op)
        if status.get("phase") == names.Phase.FAILED:
            raise CredentialsError(f"TalosOperation {ns}/{name} failed: {SCRUBBER.text(str(status.get('message')))}; "
                                   "nothing was written.")
        if status.get("phase") == names.Phase.COMPLETED:
            raise NoRotationUnderWay(f"TalosOperation {ns}/{name} completed while waiting; there is no hand-off "
                                     "left to make. Nothing was written.")
        if stage is Stage.AWAITING_CREDENTIALS or stage in _PAST:
            return op
        held = _held_by_a_person(op, cluster)
        if held is not None:
            raise StageNotReached(held)
        blocked = _blocked(op)
        if said is None or (blocked or "") != said:  # once, and again when it turns Blocked or the cause changes
            said = blocked or ""
            now = stage.value if stage else "not started"
            say(f"waiting for {name} to reach {Stage.AWAITING_CREDENTIALS.value} (now {now}; up to {wait:g} s)"
                + (f"; it is Blocked, the daemon retries it: {blocked}" if blocked else ""))
        if time.monotonic() >= deadline:
            why = f" It is Blocked: {blocked}; fix the cause it names." if blocked else ""
            raise StageNotReached(
                f"TalosOperation {ns}/{name} is still in {stage.value if stage else 'no stage'} after {wait:.0f} s."
                f"{why} Run the command again later (or with a longer --wait). Nothing was written.")
        await anyio.sleep(max(0.0, min(poll, deadline - time.monotonic())))
        op = await _api(retry, f"reading TalosOperation {ns}/{name}", lambda: crds.operations(kube).get(ns, name))


def _authorities(bundle: SecretsBundle, rotation: Rotation | None, certs: Sequence[Obj],
                 where: str) -> tuple[CertificateAuthority, list[bytes], CertificateAuthority, list[bytes]]:
    """(new OS CA, OS CAs to trust, new Kubernetes CA, Kubernetes CAs to trust), old before new."""
    if rotation is None:
        if not replaced_by(bundle, certs):
            raise CredentialsError(f"{where} holds no {names.ROTATION_KEY} and not the new CAs the operation names; "
                                   "the rotation's state is inconsistent: see the operation's status. Nothing written.")
        # Finalizing replaced secrets.yaml: the bundle's CAs are the new ones (the old are no longer kept).
        return bundle.os, [bundle.os.cert_pem], bundle.k8s, [bundle.k8s.cert_pem]
    expected = {str(c.get("name")): str(c.get("next")) for c in certs if c.get("next")}
    for target, ca in rotation.new.items():
        want = expected.get(target.value)
        if want is not None and ca_fingerprint(ca) != want:
            raise CredentialsError(f"the new {target.value} CA in {where} key {names.ROTATION_KEY} is not the one the "
                                   "operation's status names; the Secret changed under the rotation. Nothing written.")
    new_os = rotation.new.get(Target.TALOS, bundle.os)
    new_k8s = rotation.new.get(Target.KUBERNETES, bundle.k8s)
    return new_os, [bundle.os.cert_pem, new_os.cert_pem], new_k8s, [bundle.k8s.cert_pem, new_k8s.cert_pem]


async def _control_planes(kube: KubeClient, retry: Retrier, namespace: str, cluster: str) -> list[MachineView]:
    objs, _ = await _api(retry, f"listing the TalosMachines in {namespace}",
                         lambda: crds.machines(kube).list_objects(namespace))
    out = []
    for obj in objs:
        try:
            view = MachineView.of(obj)
        except MachineSpecError:
            continue
        if view.cluster == cluster and view.approved and view.is_control_plane and view.address:
            out.append(view)
    if not out:
        raise CredentialsError(f"TalosCluster {namespace}/{cluster} has no approved control plane TalosMachine with "
                               "an address; the talosconfig would have no endpoint. Nothing was written.")
    return sorted(out, key=lambda m: m.name)


async def _verify_talos(retry: Retrier, factory: Callable[[DialBundle], TalosClient], talosconfig: bytes,
                        signing: CertificateAuthority) -> None:
    dial, endpoints = talosconfig_dial(talosconfig, signing)
    client = factory(dial)
    try:
        for endpoint in endpoints:
            try:
                await retry.call(f"Talos Version on {endpoint} with the new talosconfig",
                                 lambda e=endpoint: client.version(e))  # type: ignore[misc]
            except TalosError as exc:
                raise CredentialsNotVerified(
                    f"the new talosconfig does not work on {endpoint}: {_describe(exc)}. Nothing was "
                    "written and the operation was not acknowledged; check that the machine is up and runs the "
                    "stage's configuration (the operation's status.machines), then run the command again.") from None
    finally:
        client.close()


async def _verify_kube(retry: Retrier, path: Path, server: str) -> None:
    try:
        client = await from_kubeconfig(path, namespace="default")
    except KubeError as exc:
        raise CredentialsNotVerified(f"the new kubeconfig cannot be loaded: {_describe(exc)}") from None
    try:
        for what, call_path in (("/version", "/version"), ("listing the Nodes", "/api/v1/nodes")):
            try:
                await retry.call(f"{what} on {server} with the new kubeconfig",
                                 lambda p=call_path: client.raw("GET", p))  # type: ignore[misc]
            except KubeError as exc:
                raise CredentialsNotVerified(
                    f"the new kubeconfig does not work on {server} ({what}): {_describe(exc)}. Nothing was "
                    "written and the operation was not acknowledged; the API server must accept the new Kubernetes "
                    "CA (the Accepting stage) and serve from a CA the file trusts.") from None
    finally:
        await client.close()


async def _verified(retry: Retrier, minted: Minted, server: str, signing_os: CertificateAuthority,
                    factory: Callable[[DialBundle], TalosClient]) -> None:
    """Both files, used exactly as written, from a private scratch directory."""
    with tempfile.TemporaryDirectory(prefix="ichord-credentials-") as tmp:
        os.chmod(tmp, 0o700)
        scratch = write_file(Path(tmp) / KUBECONFIG, minted.kubeconfig)
        await _verify_talos(retry, factory, minted.talosconfig, signing_os)
        await _verify_kube(retry, scratch, server)


def home_relative(path: Path) -> str:
    """``path`` as the operator's shell names it: ``~/...`` under their home, else absolute."""
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class Destination:
    """Where the files go and whether existing ones are replaced (docs/decisions.md#cli-files)."""

    directory: Path
    #: ichord's default directory (created 0700 when missing); a directory the user names must exist.
    default: bool = False
    force: bool = False

    @property
    def paths(self) -> tuple[Path, Path]:
        d = self.directory.expanduser().absolute()
        return d / TALOSCONFIG, d / KUBECONFIG

    def check(self, *, cluster: str, server: str, namespace: str) -> bool:
        """Refuse what cannot be written (exit 2, before anything is waited for); True to replace the files."""
        d = self.directory.expanduser()
        if d.exists() and not d.is_dir():
            raise CredentialsError(f"{d} is not a directory; name a directory with -d. Nothing was written.")
        if not d.exists():
            if self.default:
                return self.force
            raise CredentialsError(f"the directory {d} does not exist; create it first (mkdir -p {d}) or name "
                                   "another with -d. Nothing was written.")
        replace = self.force or earlier_hand_off(*self.paths, cluster=cluster, server=server, namespace=namespace)
        for path in self.paths:
            check_destination(path, force=replace)
        return replace

    def write(self, minted: Minted, *, replace: bool) -> tuple[Path, Path]:
        if self.default:
            make_private_dirs(self.directory)
        for path, data in zip(self.paths, (minted.talosconfig, minted.kubeconfig), strict=True):
            write_file(path, data, force=replace)
            if path.read_bytes() != data:
                raise CredentialsError(f"{path} does not hold what was written (another writer?); the operation "
                                       "was not acknowledged. Run the command again.")
        return self.paths


async def hand_off(kube: KubeClient, namespace: str, cluster: str, out: Destination | Path, *,
                   wait: float = 600.0,
                   say: Callable[[str], None] = print,
                   talos_factory: Callable[[DialBundle], TalosClient] | None = None,
                   acknowledge: bool = True, secret_namespace: str | None = None, poll: float = 2.0,
                   retry_delays: tuple[float, float] = DEFAULT_DELAYS) -> HandOff:
    """The whole hand-off for TalosCluster ``namespace/cluster``; see the module docstring.

    ``out``: where the files go (a bare path: the caller's own place, created when missing, earlier files of
    this cluster replaced). ``secret_namespace``: where the bundle Secret lives (default: where the daemon
    resolves spec.secretsRef).
    ``acknowledge``: False writes the verified files but leaves the annotation alone.
    ``wait`` bounds both the wait for the stage and each call's run of transient errors; ``poll`` is the
    interval between reads of the operation, ``retry_delays`` the backoff (first, longest); tests shorten both.
    """
    retry = Retrier(wait, say, retry_delays)
    tc = await _api(retry, f"reading TalosCluster {namespace}/{cluster}",
                    lambda: crds.clusters(kube).get(namespace, cluster))
    view = ClusterView.of(tc)
    server = str(view.spec.get("endpoint") or "")
    secret_name = view.secret_name
    if not server or not secret_name:
        raise CredentialsError(f"TalosCluster {namespace}/{cluster} lacks spec.endpoint or spec.secretsRef.name; "
                               "fix the object. Nothing was written.")
    out = out if isinstance(out, Destination) else Destination(out, default=True)  # a caller's own place
    replace = out.check(cluster=view.cluster_name, server=server, namespace=namespace)
    op = await _find_operation(kube, retry, namespace, cluster)
    op = await _await_stage(kube, retry, op, wait=wait, poll=poll, say=say)
    op_name = str(op["metadata"]["name"])
    stage = _stage(op)
    assert stage is not None  # _await_stage returns only a stage at or past AwaitingCredentials
    held = OperationView.of(op).condition(names.CA_ROTATION) or {}
    if held.get("reason") == names.CARotationReason.BUNDLE_RESTORE_REQUIRED:  # the keys are not in the Secret
        raise CredentialsError(f"TalosOperation {namespace}/{op_name} waits for its bundle Secret to be restored: run "
                               f"`ichord cluster restore-bundle {cluster} -n {namespace}` first, then this command "
                               "again. Nothing was written.")
    certs = list(((op.get("status") or {}).get("caRotation") or {}).get("certificates") or [])
    token = handoff_token(certs)
    if not token:
        raise CredentialsError(f"TalosOperation {namespace}/{op_name} shows no new CA in "
                               "status.caRotation.certificates; nothing to hand off. Nothing was written.")

    sns = secret_namespace or view.secret_namespace  # where the daemon resolves spec.secretsRef
    where = f"Secret {sns}/{secret_name}"
    secret = await _api(retry, f"reading the bundle {where}", lambda: read_secret(kube, sns, secret_name))
    raw = secret.data.get(names.SECRETS_KEY)
    if raw is None:
        raise CredentialsError(f"{where} has no {names.SECRETS_KEY}; restore it from a backup. Nothing was written.")
    bundle = SecretsBundle.from_yaml(raw, f"{where} key {names.SECRETS_KEY}")
    SCRUBBER.register_all(bundle.secret_values())
    raw_rotation = secret.data.get(names.ROTATION_KEY)
    rotation = Rotation.from_yaml(raw_rotation) if raw_rotation is not None else None
    if rotation is not None:
        SCRUBBER.register_all(ca.key_pem for ca in rotation.new.values() if ca.key_pem)
    os_new, os_trusted, k8s_new, k8s_trusted = _authorities(bundle, rotation, certs, where)
    cps = await _control_planes(kube, retry, namespace, cluster)

    minted = mint(view.cluster_name, [m.address for m in cps], server,
                  os_signing=os_new, os_trusted=os_trusted, k8s_signing=k8s_new, k8s_trusted=k8s_trusted,
                  namespace=namespace)
    await _verified(retry, minted, server, os_new, talos_factory or _talos_client)
    talos_path, kube_path = out.write(minted, replace=replace)

    acknowledged = False
    if stage is not Stage.AWAITING_CREDENTIALS:
        say(f"{op_name} is already in {stage.value}: the credentials stay valid and were written, but there is "
            "nothing to acknowledge (the rotation no longer waits for them)")
    elif acknowledge:
        patch = {"metadata": {"annotations": {names.CREDENTIALS_HANDOFF_ANNOTATION: token,
                                              names.CREDENTIALS_KUBECONFIG_ANNOTATION: home_relative(kube_path)}}}
        await _api(retry, f"annotating TalosOperation {namespace}/{op_name}",
                   lambda: crds.operations(kube).patch(namespace, op_name, patch))
        acknowledged = True
    return HandOff(op_name, talos_path, kube_path, token, stage.value, acknowledged,
                   minted.talos_client_fingerprint, minted.kube_client_fingerprint)
