"""`ichord render`: print a machine's full Talos configuration.

    ichord render --bundle secrets.yaml --cluster cluster.yaml [--machine machine.yaml]
    ichord render --bundle secrets.yaml --cluster-name c --endpoint https://c:6443 \\
        --kubernetes-version 1.34.1 [--talos-version v1.14] [--role worker]

C.yaml / M.yaml hold a TalosCluster / TalosMachine object or a bare spec. The configuration is
rendered completely before anything is printed, so an error leaves stdout empty (exit code 2).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml.error import YAMLError

from ichord import yamlio
from ichord.api.carotation import Stage
from ichord.contract import UnsupportedContractError, parse_contract
from ichord.pki.bundle import SecretsBundle
from ichord.pki.rotation import Rotation, parse_targets
from ichord.render.config import MachineConfig
from ichord.render.errors import RenderInputError
from ichord.render.generate import render
from ichord.render.inputs import ROLES, ClusterInputs, MachineInputs
from ichord.render.stages import render_stage

#: spec fields that come from flags when there is no --cluster file (error messages name the flag).
_FLAGS = {"spec.clusterName": "--cluster-name", "spec.endpoint": "--endpoint",
          "spec.kubernetesVersion": "--kubernetes-version", "spec.talosVersion": "--talos-version"}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "render",
        help="print a machine's Talos configuration",
        description="Render the full Talos machine configuration for one machine, as `talosctl gen config` "
        "generates it, with the cluster's and the machine's config patches applied.",
    )
    # Not argparse-required: `ichord render diff ...` shares this parser and takes no bundle.
    p.add_argument("--bundle", metavar="FILE", help="secrets bundle (secrets.yaml); required")
    p.add_argument("--cluster", metavar="C.yaml", help="TalosCluster object or spec")
    p.add_argument("--cluster-name", metavar="N", help="cluster name (without --cluster)")
    p.add_argument("--endpoint", metavar="URL", help="control plane endpoint https://host:6443 (without --cluster)")
    p.add_argument("--kubernetes-version", metavar="V", help="Kubernetes version, e.g. 1.34.1 (without --cluster)")
    p.add_argument("--talos-version", metavar="V", help="version contract v1.13 or v1.14 (default: the cluster's, "
                   "else v1.14); overrides spec.talosVersion")
    p.add_argument("--role", choices=ROLES, help="machine role (default controlplane, or the --machine's role)")
    p.add_argument("--machine", metavar="M.yaml", help="TalosMachine object or spec (role, hostname, patches)")
    # CA-rotation stage (docs/decisions.md#ca-rotation-passes): what the machine runs at that stage of a rotation.
    p.add_argument("--stage", metavar="S", help="render a CA-rotation stage: Accepting, Issuing, Dropping, Finalizing")
    p.add_argument("--rotation", metavar="R.yaml", help="rotation.yaml holding the new CAs (with --stage)")
    p.add_argument("--targets", metavar="t,...", help="targets to rotate (default: the keys of rotation.yaml)")
    p.set_defaults(func=run)
    _add_subcommands(p)


def _add_subcommands(p: argparse.ArgumentParser) -> None:
    """`ichord render diff` (ichord.render.diff_cli), when that module is present."""
    try:
        from ichord.render.diff_cli import add_diff_parser  # noqa: PLC0415 - optional sibling module
    except ModuleNotFoundError as exc:
        if exc.name != "ichord.render.diff_cli":
            raise
        return
    sub = p.add_subparsers(dest="render_command", metavar="{diff}")
    sub.required = False
    add_diff_parser(sub)


def run(args: argparse.Namespace) -> int:
    config = render_from_args(args)
    sys.stdout.write(config.to_yaml())
    return 0


def render_from_args(args: argparse.Namespace) -> MachineConfig:
    if not args.bundle:
        raise RenderInputError("--bundle", "is required", "pass the secrets bundle: --bundle secrets.yaml")
    if bool(args.stage) != bool(args.rotation):
        raise RenderInputError("--stage, --rotation", "go together", "pass both to render a CA-rotation stage")
    if args.targets and not args.stage:
        raise RenderInputError("--targets", "needs --stage and --rotation", "pass them, or drop --targets")
    bundle = SecretsBundle.load(args.bundle)
    cluster = cluster_from_args(args)
    machine = machine_from_args(args)
    if not args.stage:
        return render(bundle, cluster, machine)
    try:
        stage = Stage.parse(args.stage)
    except ValueError as exc:
        raise RenderInputError("--stage", str(exc), "pass Accepting, Issuing, Dropping or Finalizing") from None
    try:
        rotation = Rotation.from_yaml(Path(args.rotation).read_bytes())
    except OSError as exc:
        problem = f"{args.rotation} cannot be read ({exc.strerror})"
        raise RenderInputError("--rotation", problem, "check the path") from None
    targets = parse_targets(args.targets.split(",")) if args.targets else None
    return render_stage(bundle, rotation, stage, cluster, machine, targets)


def cluster_from_args(args: argparse.Namespace) -> ClusterInputs:
    flags = {"--cluster-name": args.cluster_name, "--endpoint": args.endpoint,
             "--kubernetes-version": args.kubernetes_version}
    if args.cluster:
        given = [flag for flag, value in flags.items() if value]
        if given:
            raise RenderInputError(", ".join(given), "cannot be combined with --cluster",
                                   "set them in the TalosCluster spec or drop --cluster")
        name, spec = _object(args.cluster, "TalosCluster", "--cluster")
    else:
        missing = [flag for flag, value in flags.items() if not value]
        if missing:
            raise RenderInputError(", ".join(missing), "is required without --cluster",
                                   "pass --cluster C.yaml or all of --cluster-name, --endpoint, --kubernetes-version")
        name = args.cluster_name
        spec = {"clusterName": args.cluster_name, "endpoint": args.endpoint,
                "kubernetesVersion": args.kubernetes_version}
    if args.talos_version:
        try:
            parse_contract(args.talos_version)
        except UnsupportedContractError as exc:
            raise RenderInputError("--talos-version", str(exc), "pass v1.13 or v1.14") from None
        spec = {**spec, "talosVersion": args.talos_version}
    try:
        return ClusterInputs.from_spec(name, spec)
    except RenderInputError as exc:
        flag = None if args.cluster else _FLAGS.get(exc.field)
        if flag is None:
            raise
        raise RenderInputError(flag, exc.problem, exc.fix) from None


def machine_from_args(args: argparse.Namespace) -> MachineInputs:
    if not args.machine:
        return MachineInputs(role=args.role or "controlplane")
    _, spec = _object(args.machine, "TalosMachine", "--machine")
    if args.role:
        if spec.get("role") not in (None, args.role):
            raise RenderInputError("--role", f"{args.role} differs from the machine's role {spec.get('role')}",
                                   "drop --role or fix spec.role")
        spec = {**spec, "role": args.role}
    return MachineInputs.from_spec(spec)


def _object(path: str, kind: str, flag: str) -> tuple[str, Mapping[str, Any]]:
    """(metadata.name, spec) of a ``kind`` object file, or ("", file) for a bare spec."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RenderInputError(flag, f"{path} cannot be read ({exc.strerror})", "check the path") from None
    try:
        doc = yamlio.load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise RenderInputError(flag, f"{path} is not valid YAML{where}", "fix the file") from None
    if not isinstance(doc, Mapping):
        raise RenderInputError(flag, f"{path} is not a YAML mapping", f"give a {kind} object or its spec")
    if "spec" in doc and ("kind" in doc or "apiVersion" in doc or "metadata" in doc):
        if doc.get("kind", kind) != kind:
            raise RenderInputError(flag, f"{path} holds a {doc.get('kind')}, not a {kind}", f"give a {kind}")
        metadata = doc.get("metadata") or {}
        name = metadata.get("name", "") if isinstance(metadata, Mapping) else ""
        return str(name or ""), doc["spec"]
    return "", doc
