"""``ichord cluster ...``: commands about one TalosCluster, run with the user's kubeconfig.

``credentials`` is the operator's side of a CA rotation's AwaitingCredentials stage
(docs/decisions.md#credentials-handoff): see ichord.credentials.

``bundle-export`` saves the live secrets bundle and acknowledges it with the annotation
``ichor.maesh.dev/bundle-exported: <ExportFingerprint>`` (docs/decisions.md#bundle-backup-stale,
docs/decisions.md#bundle-backup-stale); the daemon's expiry pass lowers BundleBackupStale when that equals the live
bundle's. The CLI writes metadata only, never spec or status.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ichord import operation_cli
from ichord.api import views
from ichord.api.carotation import Stage
from ichord.api.conditions import find
from ichord.api.names import (
    BUNDLE_CUSTODY_FINALIZER,
    BUNDLE_EXPORTED_ANNOTATION,
    CREDENTIALS_HANDOFF_ANNOTATION,
    READY,
    ROTATION_KEY,
    SECRETS_KEY,
    ReadyReason,
)
from ichord.cluster_status import ClusterView, format_status, read_view
from ichord.credentials import DEFAULT_CREDENTIALS_DIR, HandOff, hand_off
from ichord.credentials.handoff import Destination, home_relative
from ichord.errors import IchordError, RuntimeFailure
from ichord.etcd_snapshot import cli as etcd_snapshot_cli
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters
from ichord.kube.errors import KubeConfigError, KubeError, NotFound
from ichord.kube.reads import read_secret
from ichord.operations.ca_rotation.restore import Restored, RestoreFailed, RestoreRefused, restore_bundle
from ichord.operations.config import cli as config_cli
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import export_fingerprint
from ichord.pki.scrub import SCRUBBER
from ichord.rehearsal import cli as rehearsal_cli
from ichord.safefile import check_destination, make_private_dirs, write_file

#: Where ``ichor init`` keeps a cluster's bundle (docs/decisions.md#bundle-backup-stale); ``{name}`` is the
#: TalosCluster.
DEFAULT_EXPORT_PATH = "~/.ichord/clusters/{name}/secrets.yaml"


class ClusterCommandError(IchordError):
    """An ``ichord cluster`` command cannot do what was asked; the message says why and what to do."""


class RotationUnderWay(ClusterCommandError):
    """The bundle Secret holds rotation.yaml: the bundle will change at Finalizing."""


class BundleNotTrusted(ClusterCommandError):
    """The cluster's Ready says its nodes do not trust the bundle in its Secret (BundleMismatch)."""


class BundleNotOwned(ClusterCommandError):
    """The cluster's Ready says another TalosCluster, created first, holds its bundle Secret (BundleInUse)."""


class ExportNotVerified(ClusterCommandError, RuntimeFailure):
    """The file read back is not the live bundle; no annotation was written."""


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="commands about one TalosCluster (bundle export, ...)")
    sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    _register_bundle_export(sub)
    _register_credentials(sub)
    _register_status(sub)
    _register_restore_bundle(sub)
    config_cli.register(sub, _cluster_args)
    etcd_snapshot_cli.register(sub, _cluster_args)
    operation_cli.register_rotate(sub, _cluster_args)
    rehearsal_cli.register(sub, _cluster_args)


BUNDLE_NAMESPACE_HELP = (
                         "namespace field, else the TalosCluster's namespace)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """NAME, -n and the kubeconfig flags every cluster subcommand takes, spelled once."""
    p.add_argument("name", metavar="NAME", type=operation_cli.object_name, help="the TalosCluster")
    p.add_argument("-n", "--namespace", type=operation_cli.namespace_name,
                   help="the TalosCluster's namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")


def _register_bundle_export(sub: Any) -> None:
    p = sub.add_parser(
        "bundle-export",
        help="save the live secrets bundle and clear BundleBackupStale",
        description=(
            "Read the cluster's live secrets bundle from its Secret (uncached), write it with mode 0600, "
            "read the file back, and only if it holds the live bundle annotate the TalosCluster with "
            f"{BUNDLE_EXPORTED_ANNOTATION}=<ExportFingerprint>; the daemon then lowers BundleBackupStale. "
            "Refused while a CA rotation is under way (the Secret holds rotation.yaml): the bundle changes "
            "at Finalizing, so export after the rotation completes; refused too while the cluster's Ready says "
            "BundleMismatch (the nodes do not trust the bundle in the Secret) or BundleInUse (another cluster holds "
            "the Secret: export from that one). An earlier export of the same cluster "
            "at the path is replaced (it describes CAs the nodes may no longer accept); any other file is kept and "
            "the export refused, unless --force."
        ),
    )
    _cluster_args(p)
    p.add_argument("-o", dest="output", type=Path, action=operation_cli.DeprecatedAlias, instead="-f/--file",
                   help=argparse.SUPPRESS)
    p.add_argument("-f", "--file", "--output", dest="output", type=Path, metavar="FILE",
                   help=f"file to write; its directory must exist (default "
                        f"{DEFAULT_EXPORT_PATH.format(name='NAME')}, its directory created with mode 0700)")
    p.add_argument("--force", action="store_true",
                   help="replace the file even when it is not an earlier export of this cluster (another cluster's "
                        "bundle, say)")
    p.add_argument("--secret-namespace", type=operation_cli.namespace_name, help=BUNDLE_NAMESPACE_HELP)
    p.set_defaults(func=_bundle_export_main)


def _register_credentials(sub: Any) -> None:
    p = sub.add_parser(
        "credentials",
        help="hand off a CA rotation: write a talosconfig and kubeconfig from the new CAs and acknowledge them",
        description=(
            "Wait until the cluster's ca-rotation reaches AwaitingCredentials, mint a talosconfig (os:admin, "
            "signed by the new OS CA, trusting the old and new) and an admin kubeconfig (signed by the new "
            "Kubernetes CA, trusting the old and new), prove both against the cluster (Version on every control "
            "plane, /version and the Nodes on the API), write them with mode 0600 and, with --acknowledge, set "
            f"{CREDENTIALS_HANDOFF_ANNOTATION} on the operation so the rotation goes on to Issuing. Transient API "
            "errors (the API server restarting, a webhook timing out) are waited through for up to --wait "
            "seconds. Run after Issuing, it still writes working credentials but acknowledges nothing."
        ),
    )
    _cluster_args(p)
    p.add_argument("--acknowledge", action="store_true",
                   help="after the files are verified and written, let the rotation go on (sets the annotation); "
                        "without it nothing on the cluster changes")
    p.add_argument("-o", dest="output_dir", type=Path, action=operation_cli.DeprecatedAlias, instead="-d/--output-dir",
                   help=argparse.SUPPRESS)
    p.add_argument("-d", "--output-dir", type=Path, metavar="DIR",
                   help=f"directory for the files talosconfig and kubeconfig: it must exist (default "
                        f"{DEFAULT_CREDENTIALS_DIR.format(name='NAME')}, created with mode 0700); files there are "
                        "replaced only when they are an earlier hand-off's for this cluster, else with --force")
    p.add_argument("--force", action="store_true",
                   help="replace a talosconfig or kubeconfig in the directory whatever it holds")
    p.add_argument("--secret-namespace", type=operation_cli.namespace_name, help=BUNDLE_NAMESPACE_HELP)
    p.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for the stage and through transient API errors (default 600)")
    p.set_defaults(func=_credentials_main)


def _register_status(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="show a cluster's conditions, CA expiry, machines and operations, and what to run next",
        description=(
            "Read the TalosCluster, its TalosMachines and TalosOperations and print the cluster's conditions, "
            "its CAs' expiry and fingerprints, each machine's readiness, every operation not finished (phase, "
            "stage, what it waits for) with the command that moves it on, and the last finished one. Prints "
            "fingerprints only, never key or certificate material. Changes nothing."
        ),
    )
    _cluster_args(p)
    operation_cli.add_output_format(p)
    p.set_defaults(func=_status_main)


def _register_restore_bundle(sub: Any) -> None:
    p = sub.add_parser(
        "restore-bundle",
        help="put back the bundle Secret a CA rotation lost, from the rotation's custody copy",
        description=(
            "While a ca-rotation is under way its new CA keys are kept twice: in the bundle Secret (rotation.yaml, "
            f"held by the finalizer {BUNDLE_CUSTODY_FINALIZER}) and in a custody copy, the Secret "
            "ichord-custody-<operation UID> owned by the TalosOperation. When the bundle Secret is deleted anyway, "
            "loses rotation.yaml or is replaced by an older secrets.yaml, the rotation pauses with "
            "CARotation=False/BundleRestoreRequired and names this command. It writes the bundle Secret the "
            "rotation needs at its stage from the copy (secrets.yaml as the rotation started from it plus its "
            "rotation.yaml; from Finalizing on, secrets.yaml with the new CAs), creating it, updating it, or "
            "recreating one that is being deleted; the rotation then goes on with the same new CAs. Prints "
            "fingerprints only. Exit 0: restored or already whole; 1: the copy is missing or unusable, or the "
            "write failed; 2: bad input (no such cluster, no rotation under way), nothing written."
        ),
    )
    _cluster_args(p)
    p.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for a Secret being deleted to go before creating it again (default 30)")
    p.set_defaults(func=_restore_bundle_main)


def _restore_bundle_main(args: argparse.Namespace) -> int:
    if args.wait <= 0:
        print("ichord: --wait must be a positive number of seconds; nothing was written", file=sys.stderr)
        return 2
    try:
        done = asyncio.run(_restore_bundle_cli(args))
    except (RestoreRefused, KubeConfigError) as exc:
        print(f"ichord: {SCRUBBER.text(str(exc))}", file=sys.stderr)
        return 2
    except (RestoreFailed, KubeError) as exc:
        print(f"ichord: {SCRUBBER.text(str(exc))}", file=sys.stderr)
        return 1
    if done.action == "unchanged":
        print(f"Secret {done.secret} already holds what TalosOperation {done.operation} needs in {done.stage}; "
              "nothing was written")
    else:
        print(f"{done.action} Secret {done.secret} from the custody copy Secret {done.copy} "
              f"(TalosOperation {done.operation}, stage {done.stage})")
    print(f"the rotation goes on with the same new CAs: {', '.join(done.fingerprints)}")
    return 0


async def _restore_bundle_cli(args: argparse.Namespace) -> Restored:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await restore_bundle(kube, args.namespace or kube.namespace, args.name, wait=args.wait)


def _status_main(args: argparse.Namespace) -> int:
    view = asyncio.run(_status_cli(args))
    now = dt.datetime.now(dt.UTC)
    if args.output == "text":
        print(format_status(view, now), end="")
    else:
        print(operation_cli.dump(view.as_data(now), args.output), end="")
    return 0


async def _status_cli(args: argparse.Namespace) -> ClusterView:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await read_view(kube, args.namespace or kube.namespace, args.name, operation_cli.kube_flags(args))


def _credentials_main(args: argparse.Namespace) -> int:
    if args.wait <= 0:
        raise ClusterCommandError("--wait must be a positive number of seconds. Nothing was written.")
    result = asyncio.run(_credentials_cli(args))  # errors: ichord.cli.main prints them scrubbed, with the exit code
    print(f"wrote {result.talosconfig} (mode 0600; os:admin client certificate sha256 "
          f"{result.talos_client_fingerprint})")
    print(f"wrote {result.kubeconfig} (mode 0600; admin client certificate sha256 {result.kube_client_fingerprint})")
    print("both verified against the cluster with exactly these files")
    if result.acknowledged:
        print(f"acknowledged TalosOperation {result.operation} ({CREDENTIALS_HANDOFF_ANNOTATION}); "
              "the rotation goes on to Issuing")
    elif result.stage == Stage.AWAITING_CREDENTIALS.value:
        print(f"not acknowledged: TalosOperation {result.operation} keeps waiting in AwaitingCredentials; "
              f"run again with --acknowledge once you have checked the files")
    print(f"use them: talosctl --talosconfig {_shell_path(result.talosconfig)} ...; kubectl --kubeconfig "
          f"{_shell_path(result.kubeconfig)} ...")
    return 0


def _shell_path(path: Path) -> str:
    shown = home_relative(path)
    return "~/" + shlex.quote(shown[2:]) if shown.startswith("~/") else shlex.quote(shown)


async def _credentials_cli(args: argparse.Namespace) -> HandOff:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        out = Destination(args.output_dir or Path(DEFAULT_CREDENTIALS_DIR.format(name=args.name)),
                          default=args.output_dir is None, force=args.force)
        # Progress ("waiting for ...") on stderr: stdout holds only what was done, and nothing on a failure.
        return await hand_off(kube, args.namespace or kube.namespace, args.name, out, wait=args.wait,
                              acknowledge=args.acknowledge, secret_namespace=args.secret_namespace,
                              say=lambda line: print(line, file=sys.stderr))


def _bundle_export_main(args: argparse.Namespace) -> int:
    report = asyncio.run(_bundle_export_cli(args))
    print(f"wrote {report.path} (mode 0600), the live bundle of TalosCluster {report.namespace}/{report.name}")
    print(f"export fingerprint {report.fingerprint}")
    print(f"annotated {BUNDLE_EXPORTED_ANNOTATION}; the daemon lowers BundleBackupStale at its next expiry pass")
    return 0


async def _bundle_export_cli(args: argparse.Namespace) -> ExportReport:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await bundle_export(kube, args.name, namespace=args.namespace or kube.namespace,
                                   output=args.output, secret_namespace=args.secret_namespace, force=args.force)


def _bundle_at(path: Path) -> SecretsBundle | None:
    try:
        return SecretsBundle.load(path)
    except (IchordError, OSError):
        return None


def _earlier_export(path: Path, live: SecretsBundle) -> bool:
    """The file holds a bundle of the same cluster (its id and secret; a CA rotation changes neither)."""
    old = _bundle_at(path) if path.is_file() else None
    return old is not None and (old.cluster_id, old.cluster_secret) == (live.cluster_id, live.cluster_secret)


def _what_is_in(path: Path) -> str:
    return "another cluster's secrets bundle" if _bundle_at(path) is not None else "no secrets bundle"


@dataclass(frozen=True)
class ExportReport:
    namespace: str
    name: str
    path: Path
    fingerprint: str


async def bundle_export(kube: KubeClient, name: str, *, namespace: str, output: Path | None = None,
                        secret_namespace: str | None = None, force: bool = False) -> ExportReport:
    """Export the live bundle of TalosCluster ``namespace/name`` and annotate it (the whole command).

    ``output`` (its directory must exist; default ichord's own place, created 0700) is replaced only when it holds
    an earlier export of this cluster (the same cluster id and secret, which a CA rotation keeps), or with
    ``force`` (docs/decisions.md#cli-files)."""
    path = (output or Path(DEFAULT_EXPORT_PATH.format(name=name))).expanduser()
    if output is not None or path.parent.exists():
        check_destination(path, force=True)  # a directory, a missing or unwritable directory: refused before reads
    objects = clusters(kube)
    try:
        cluster = await objects.get(namespace, name)
    except NotFound:
        raise ClusterCommandError(f"TalosCluster {namespace}/{name} not found; check the name and -n") from None
    view = views.ClusterView.of(cluster)
    secret_name = view.secret_name
    if not secret_name:
        raise ClusterCommandError(f"TalosCluster {namespace}/{name} has no spec.secretsRef.name; nothing to export")
    ready = find(view.status.get("conditions"), READY)
    if ready is not None and ready.get("reason") == ReadyReason.BUNDLE_MISMATCH:
        # An export of a bundle the nodes refuse would replace the operator's good copy with another cluster's.
        raise BundleNotTrusted(
            f"the nodes of {namespace}/{name} do not trust the bundle in its Secret (Ready BundleMismatch: "
            f"{SCRUBBER.text(str(ready.get('message') or ''))}); exporting it would replace your saved copy. Put the "
            f"cluster's own bundle back and run this again once Ready says so. Nothing was written.")
    if ready is not None and ready.get("reason") == ReadyReason.BUNDLE_IN_USE:
        # The bundle is another cluster's (docs/decisions.md#one-owner): this one's BundleBackupStale is nobody's to
        # lower, and the export is the holder's to make.
        raise BundleNotOwned(
            f"TalosCluster {namespace}/{name} does not hold its bundle Secret (Ready BundleInUse: "
            f"{SCRUBBER.text(str(ready.get('message') or ''))}); export the bundle from the cluster that holds it. "
            "Nothing was written.")
    secret_ns = secret_namespace or view.secret_namespace  # where the daemon resolves it
    try:
        secret = await read_secret(kube, secret_ns, str(secret_name))
    except NotFound:
        raise ClusterCommandError(
            f"the bundle Secret {secret_ns}/{secret_name} does not exist; check the TalosCluster's "
            f"spec.secretsRef, or pass --secret-namespace") from None
    if ROTATION_KEY in secret.data:
        raise RotationUnderWay(
            f"a CA rotation of {namespace}/{name} is under way (Secret {secret_ns}/{secret_name} holds "
            f"{ROTATION_KEY}); the bundle changes when the rotation reaches Finalizing, so an export now "
            f"would be stale at once. Export after the rotation completes. Nothing was written.")
    raw = secret.data.get(SECRETS_KEY)
    if raw is None:
        raise ClusterCommandError(f"Secret {secret_ns}/{secret_name} has no {SECRETS_KEY} key; nothing to export")
    live = SecretsBundle.from_yaml(raw, f"Secret {secret_ns}/{secret_name} key {SECRETS_KEY}")
    fingerprint = export_fingerprint(live)

    replace = force or _earlier_export(path, live)
    if path.exists() and not replace:
        raise ClusterCommandError(
            f"{path} exists and is not an earlier export of TalosCluster {namespace}/{name} (it holds "
            f"{_what_is_in(path)}); it is kept: choose another -f FILE, or pass --force to replace it. Nothing was "
            "written.")
    if output is None:
        make_private_dirs(path.parent)  # ichord's own place
    path = write_file(path, raw, force=replace)
    saved = SecretsBundle.load(path)
    if export_fingerprint(saved) != fingerprint or path.read_bytes() != raw:
        raise ExportNotVerified(f"{path} does not hold the live bundle after writing it (another writer, or "
                                f"a full disk?); the TalosCluster was not annotated. Run the export again.")
    await objects.patch(namespace, name, {"metadata": {"annotations": {BUNDLE_EXPORTED_ANNOTATION: fingerprint}}})
    return ExportReport(namespace, name, path, fingerprint)


