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
and compares). The managed clusters are reached with the admin kubeconfig their Talos control
planes issue, never with this service account.

## Namespaces

A TalosCluster's bundle Secret is, by default, in the cluster's own namespace (`spec.secretsRef`
without `namespace`), and each operation's cluster lock (Lease `ichord-lock-<cluster>`) is in the
cluster's namespace too. So the chart grants, per namespace ichord serves:

- every namespace (the ClusterRole, `rbac.create`): get/list/watch TalosClusters, TalosMachines and
  TalosOperations, patch their status and the operations' finalizers, create TalosOperations (the
  ca-rotation a TalosCluster's `spec.caRotation.renewBefore` plans), create/patch Events;
- the release namespace (a Role): the leader Lease `ichord-leader`, and the bundle Secrets
  (get/list/watch/update) and cluster locks (create/get/update Leases) of the TalosClusters there;
- each namespace in `watchNamespaces` (a Role and RoleBinding there): the bundle Secrets and cluster
  locks of the TalosClusters there;
- each namespace in `controller.allowedSecretNamespaces` (a Role `-bundles` there): bundle Secrets
  that TalosClusters of other namespaces name in `spec.secretsRef.namespace`;
- with `watchAllNamespaces: true` (the ClusterRole): the bundle Secrets and cluster locks everywhere.

To run a TalosCluster in namespace `team-a`, install with `--set 'watchNamespaces={{team-a}}'` (or
add it and `helm upgrade`). The daemon also watches the bundle Secrets of each listed namespace
(`--watch-namespace`), so a changed bundle wakes its cluster at once.

`watchAllNamespaces: true` serves every namespace without a `helm upgrade` per namespace. The
trade-off: the service account may then read, update, create and delete every Secret of the management cluster
(RBAC cannot select Secrets by label), and a bundle Secret outside the release namespace is read on
each of its cluster's steps rather than watched.

A TalosCluster in a namespace the install does not cover is not ignored: ichord still sees it, and
the request the management API refuses (HTTP 403) becomes a condition on the object it blocks, with
one Warning Event (reason `Forbidden`), naming the verb, the resource, the namespace and the chart
value that grants it:

- the bundle Secret: the TalosCluster's `Ready` and each of its machines' `Ready` (`False/Forbidden`);
- the cluster lock or the bundle Secret of an operation: the TalosOperation's `CARotation` or
  `ConfigRollout` condition (`False/Forbidden`, phase `Paused`); nothing is started or written, and it
  resumes where it stood once the grant is there;
- a status write itself (a ClusterRole rule taken away): the condition cannot be written, so one
  Warning Event `Forbidden` on the object says it.

```sh
kubectl get taloscluster -n team-a demo -o jsonpath='{{.status.conditions[?(@.type=="Ready")].message}}'
```

## Protections the RBAC carries

- **Guarded deletes.** `patch` on `talosclusters` and `talosmachines` (besides `talosoperations`): while an
  operation of a cluster runs, the TalosCluster and the TalosMachines it covers carry the finalizer
  `ichor.maesh.dev/operation-in-progress`; a `kubectl delete` waits (condition `DeletionHeld`, one Warning)
  until the operation completes or is abandoned.
- **Key custody.** `create` and `delete` on Secrets in each namespace ichord serves (the rules above): from
  the moment a CA rotation generates new CA keys until the bundle Secret holds them as current, they are
  kept twice, in the bundle Secret (held by the finalizer `ichor.maesh.dev/ca-custody`, written with the
  `update` it already had) and in a custody copy `ichord-custody-<operation UID>` (type
  `ichor.maesh.dev/ca-custody`, owned by the TalosOperation), deleted at Done or abandon. If the bundle
  Secret is lost anyway, the rotation pauses with `BundleRestoreRequired` and names `ichord cluster
  restore-bundle NAME -n NS`, which restores it from the copy (run with your own credentials: it creates or
  updates the bundle Secret). The copy is a Secret holding CA keys: whoever may read Secrets in the bundle's
  namespace may read it, exactly as the bundle.

## Operations: intent and etcd snapshots

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
