"""``ichord cluster ...``: commands about one TalosCluster, run with the user's kubeconfig.

``credentials`` is the operator's side of a CA rotation's AwaitingCredentials stage (ADR 0091,
ADR 0120 §5): see ichord.credentials.

``bundle-export`` saves the live secrets bundle and acknowledges it with the annotation
``ichor.maesh.dev/bundle-exported: <ExportFingerprint>`` (ADR 0063 "BundleBackupStale", ADR 0120
§5); the daemon's expiry pass lowers BundleBackupStale when that equals the live bundle's. The CLI
writes metadata only, never spec or status.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ichord.api import views
from ichord.api.names import (
    BUNDLE_EXPORTED_ANNOTATION,
    CREDENTIALS_HANDOFF_ANNOTATION,
    ROTATION_KEY,
    SECRETS_KEY,
)
from ichord.cluster_status import ClusterView, format_status, read_view
from ichord.credentials import DEFAULT_CREDENTIALS_DIR, HandOff, files, hand_off
from ichord.errors import IchordError
from ichord.kube.client import KubeClient, from_kubeconfig
from ichord.kube.crds import clusters
from ichord.kube.errors import NotFound
from ichord.kube.reads import read_secret
from ichord.operations.config import cli as config_cli
from ichord.pki.bundle import SecretsBundle
from ichord.pki.fingerprint import export_fingerprint
from ichord.pki.scrub import SCRUBBER

#: Where ``ichor init`` keeps a cluster's bundle (ADR 0063 Decision 4); ``{name}`` is the TalosCluster.
DEFAULT_EXPORT_PATH = "~/.ichord/clusters/{name}/secrets.yaml"


class ClusterCommandError(IchordError):
    """An ``ichord cluster`` command cannot do what was asked; the message says why and what to do."""


class RotationUnderWay(ClusterCommandError):
    """The bundle Secret holds rotation.yaml: the bundle will change at Finalizing."""


class ExportNotVerified(ClusterCommandError):
    """The file read back is not the live bundle; no annotation was written."""


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="commands about one TalosCluster (bundle export, ...)")
    sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="SUBCOMMAND")
    _register_bundle_export(sub)
    _register_credentials(sub)
    _register_status(sub)
    config_cli.register(sub, _cluster_args)


BUNDLE_NAMESPACE_HELP = (
                         "namespace field, else the TalosCluster's namespace)")


def _cluster_args(p: argparse.ArgumentParser) -> None:
    """NAME, -n and the kubeconfig flags every cluster subcommand takes, spelled once."""
    p.add_argument("name", metavar="NAME", help="the TalosCluster")
    p.add_argument("-n", "--namespace", help="the TalosCluster's namespace (default: the kubeconfig context's)")
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
            "at Finalizing, so export after the rotation completes. An earlier export at the same path is "
            "replaced (it describes CAs the nodes may no longer accept)."
        ),
    )
    _cluster_args(p)
    p.add_argument("-o", "--output", type=Path,
                   help=f"file to write (default {DEFAULT_EXPORT_PATH.format(name='NAME')}; missing parent "
                        "directories are created with mode 0700; an existing file is overwritten)")
    p.add_argument("--secret-namespace", help=BUNDLE_NAMESPACE_HELP)
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
    p.add_argument("-o", "--output-dir", type=Path,
                   help=f"directory for the files talosconfig and kubeconfig (default "
                        f"{DEFAULT_CREDENTIALS_DIR.format(name='NAME')}; created with mode 0700; existing files "
                        "are replaced)")
    p.add_argument("--secret-namespace", help=BUNDLE_NAMESPACE_HELP)
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
    p.set_defaults(func=_status_main)


def _status_main(args: argparse.Namespace) -> int:
    view = asyncio.run(_status_cli(args))
    print(format_status(view, dt.datetime.now(dt.UTC)), end="")
    return 0


async def _status_cli(args: argparse.Namespace) -> ClusterView:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        return await read_view(kube, args.namespace or kube.namespace, args.name)


def _credentials_main(args: argparse.Namespace) -> int:
    if args.wait <= 0:
        print("ichord: --wait must be a positive number of seconds", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(_credentials_cli(args))
    except IchordError as exc:
        # Scrubbed again: a message built from a server's answer must never carry key material.
        print(f"ichord: {SCRUBBER.text(str(exc))}", file=sys.stderr)
        return 2
    print(f"wrote {result.talosconfig} (mode 0600; os:admin client certificate sha256 "
          f"{result.talos_client_fingerprint})")
    print(f"wrote {result.kubeconfig} (mode 0600; admin client certificate sha256 {result.kube_client_fingerprint})")
    print("both verified against the cluster with exactly these files")
    if result.acknowledged:
        print(f"acknowledged TalosOperation {result.operation} ({CREDENTIALS_HANDOFF_ANNOTATION}); "
              "the rotation goes on to Issuing")
    elif result.stage == "AwaitingCredentials":
        print(f"not acknowledged: TalosOperation {result.operation} keeps waiting in AwaitingCredentials; "
              f"run again with --acknowledge once you have checked the files")
    print(f"use them: talosctl --talosconfig {result.talosconfig} ...; kubectl --kubeconfig {result.kubeconfig} ...")
    return 0


async def _credentials_cli(args: argparse.Namespace) -> HandOff:
    kube = await from_kubeconfig(args.kubeconfig, context=args.context, namespace=args.namespace)
    async with kube:
        out_dir = args.output_dir or Path(DEFAULT_CREDENTIALS_DIR.format(name=args.name))
        return await hand_off(kube, args.namespace or kube.namespace, args.name, out_dir, wait=args.wait,
                              acknowledge=args.acknowledge, secret_namespace=args.secret_namespace)


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
                                   output=args.output, secret_namespace=args.secret_namespace)


@dataclass(frozen=True)
class ExportReport:
    namespace: str
    name: str
    path: Path
    fingerprint: str


async def bundle_export(kube: KubeClient, name: str, *, namespace: str, output: Path | None = None,
                        secret_namespace: str | None = None) -> ExportReport:
    """Export the live bundle of TalosCluster ``namespace/name`` and annotate it (the whole command)."""
    objects = clusters(kube)
    try:
        cluster = await objects.get(namespace, name)
    except NotFound:
        raise ClusterCommandError(f"TalosCluster {namespace}/{name} not found; check the name and -n") from None
    view = views.ClusterView.of(cluster)
    secret_name = view.secret_name
    if not secret_name:
        raise ClusterCommandError(f"TalosCluster {namespace}/{name} has no spec.secretsRef.name; nothing to export")
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

    path = (output or Path(DEFAULT_EXPORT_PATH.format(name=name))).expanduser()
    files.write_private(path, raw)  # a PrivateFileError names the path; main prints it and exits 2
    saved = SecretsBundle.load(path)
    if export_fingerprint(saved) != fingerprint or path.read_bytes() != raw:
        raise ExportNotVerified(f"{path} does not hold the live bundle after writing it (another writer, or "
                                f"a full disk?); the TalosCluster was not annotated. Run the export again.")
    await objects.patch(namespace, name, {"metadata": {"annotations": {BUNDLE_EXPORTED_ANNOTATION: fingerprint}}})
    return ExportReport(namespace, name, path, fingerprint)


