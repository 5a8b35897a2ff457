#!/usr/bin/env python3
"""Write helm/ichord/README.md from Chart.yaml and the `# --` comments of values.yaml.

    scripts/chart_readme.py          # rewrite the README
    scripts/chart_readme.py --check  # exit 1 when the README is not what the values say (a test runs this)

A value is documented by a comment block starting with ``# --`` right above its key; the table lists
every documented key with its default (a documented mapping is shown whole, its keys not listed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "ichord"
README = CHART / "README.md"

INTRO = """\
# ichord Helm chart

{description}

Chart version {version}, app version {app_version}. This file is generated from `values.yaml` by
`scripts/chart_readme.py`; edit the comments there.

## Install

```sh
helm install ichord helm/ichord --namespace ichord-system --create-namespace
```

The CRDs (TalosCluster, TalosMachine, TalosOperation) are installed and upgraded with the chart from
`files/crds/` (`crds.enabled`), and kept on uninstall (`crds.keep`). Without the chart:
`kubectl apply -f helm/ichord/files/crds/`.

RBAC grants exactly what the daemon uses on the management cluster (a test records its requests
and compares): the custom resources in every namespace; the bundle Secrets and the Leases in the
release namespace. The managed clusters are reached with the admin kubeconfig their Talos control
planes issue, never with this service account.

An operation's intent cannot change once it started: a ValidatingAdmissionPolicy and its binding
(`admissionPolicy.enabled`; cluster-scoped, named as the release's objects; rendered only for
Kubernetes >= 1.30, which serves `admissionregistration.k8s.io/v1` policies)
make the API server refuse any change of a TalosOperation's spec but `spec.paused` once its stored
`status.phase` has left Pending, naming the fields in the refusal. Without the policy (disabled, or
an older API server) the change is accepted by the API and ignored by ichord, which runs on the spec
it recorded at the start (`status.acceptedSpec`) and reports it: condition `SpecChangeIgnored`, one
Warning Event, and a line in `ichord cluster status`.

etcd snapshots before control-plane reboots: give the daemon a volume (`etcdSnapshots.volume`,
mounted at `etcdSnapshots.mountPath`, default `/var/lib/ichord/snapshots`) and name a directory on
it in a TalosCluster (`spec.etcdSnapshots: {{path: /var/lib/ichord/snapshots, retain: 5}}`); a
ca-rotation of the etcd CA and a `config` rollout that reboots a control plane then write one there
(`<namespace>_<cluster>_<UTC time>_<operation>.db`, the newest `retain` of the cluster kept) before
anything changes, and record it in the operation's `status.etcdSnapshot` and `status.plan`. The image
runs as UID/GID 65532 (`podSecurityContext.fsGroup` makes a claim writable). With two replicas the
claim must be ReadWriteMany (both mount it; the leader writes).

## Values

| Key | Default | Description |
|-----|---------|-------------|
"""


def documented(text: str) -> list[tuple[str, str]]:
    """(dotted key, description) for each ``# --`` comment block, in file order."""
    out: list[tuple[str, str]] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if comment is not None:
                comment.append(stripped[1:].strip())
            continue
        if not stripped or ":" not in stripped or stripped.startswith("-"):
            comment = None if not stripped else comment
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if comment is not None:
            out.append((".".join(k for _, k in stack), " ".join(comment)))
            comment = None
    return out


def lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def render() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    out = INTRO.format(description=" ".join(str(chart["description"]).split()), version=chart["version"],
                       app_version=chart["appVersion"])
    for key, description in documented(text):
        default = json.dumps(lookup(values, key), separators=(", ", ": "))
        cell = description.replace("|", "\\|")
        out += f"| `{key}` | `{default}` | {cell} |\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    want = render()
    if args.check:
        if not README.exists() or README.read_text() != want:
            print(f"{README} is stale: run scripts/chart_readme.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
