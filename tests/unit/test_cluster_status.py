"""`ichord cluster status`'s report is a pure function of the objects read: golden output and next commands.

The objects have the shapes a mid-rotation cluster really has (the operation's status is what
ichord.operations.ca_rotation writes at AwaitingCredentials, as tests/integration/_ca_rotation_driver.py
drives it); the cluster's and machines' status are what the cluster actor publishes.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from ichord.cluster_status import ClusterView, format_status, next_step

Obj = dict[str, Any]
GOLDEN = Path(__file__).parent / "golden" / "cluster_status_awaiting_credentials.txt"
NOW = dt.datetime(2026, 12, 1, 17, 0, 0, tzinfo=dt.UTC)
NS = "ichord-system"

TALOS_OLD, TALOS_NEW = "89a7c0b13264a073a6a23cafca02b77484fed3310675e00288bce8317020a395", \
    "6c31804113f48eac45c29fcc8e80db0d69c5fda0b652590797aa910d5fc642b8"
K8S_OLD, K8S_NEW = "bd160e49463d618962921cdefbfabef5fc139a42ba621a2de6c467eb46e3ae93", \
    "88d16de4885ef4a76a53e7e161b11d54db0d753fcf5eaedf8326c244f0030ecf"
AWAITING = ("waiting for the operator's credentials from the new CAs: run "
            "`ichord cluster credentials demo --acknowledge`")


def cond(ctype: str, status: str, reason: str, message: str, when: str) -> Obj:
    return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}


def cluster() -> Obj:
    return {
        "metadata": {"name": "demo", "namespace": NS, "creationTimestamp": "2026-11-30T09:00:00Z"},
        "spec": {"secretsRef": {"name": "demo-secrets"}, "endpoint": "https://127.105.79.11:6443"},
        "status": {
            "certificates": [
                {"name": "talos", "notAfter": "2036-11-28T09:00:00Z", "fingerprint": TALOS_OLD},
                {"name": "kubernetes", "notAfter": "2027-01-15T09:00:00Z", "fingerprint": K8S_OLD},
            ],
            "conditions": [
                cond("CertificatesExpiring", "True", "CAsExpiring",
                     "the kubernetes CA expires on 2027-01-15T09:00:00Z (in 44 days)", "2026-11-30T09:01:00Z"),
                cond("BundleBackupStale", "False", "BundleExported", "the exported bundle is the live one",
                     "2026-11-30T09:30:00Z"),
            ],
        },
    }


def machine(name: str, role: str, ready: str, reason: str) -> Obj:
    return {"metadata": {"name": name, "namespace": NS},
            "spec": {"clusterRef": {"name": "demo"}, "role": role, "address": "127.105.79.11", "approved": True},
            "status": {"conditions": [cond("Ready", ready, reason, "", "2026-12-01T16:55:00Z")]}}


def rotation(*, stage: str = "AwaitingCredentials", phase: str = "InProgress", reason: str = "AwaitingCredentials",
             status: str = "Unknown", message: str = AWAITING, paused: bool = False) -> Obj:
    return {
        "metadata": {"name": "rotate", "namespace": NS, "creationTimestamp": "2026-12-01T16:50:00Z",
                     "finalizers": ["ichor.maesh.dev/ca-rotation"]},
        "spec": {"clusterRef": {"name": "demo"}, "kind": "ca-rotation", "paused": paused, "maxUnavailable": 1},
        "status": {
            "startedAt": "2026-12-01T16:50:00Z",
            "phase": phase,
            "message": message,
            "caRotation": {
                "stage": stage, "targets": ["talos", "kubernetes"],
                "certificates": [
                    {"name": "talos", "previous": TALOS_OLD, "next": TALOS_NEW, "issuing": TALOS_OLD,
                     "accepted": [TALOS_OLD, TALOS_NEW]},
                    {"name": "kubernetes", "previous": K8S_OLD, "next": K8S_NEW, "issuing": K8S_OLD,
                     "accepted": [K8S_OLD, K8S_NEW]},
                ],
            },
            "machines": [],
            "conditions": [cond("CARotation", status, reason, message, "2026-12-01T16:58:30Z")],
        },
    }


def finished_rotation() -> Obj:
    op = rotation(stage="Done", phase="Completed", reason="Rotated", status="True",
                  message="rotated talos; every machine trusts and is signed by the new CA")
    op["metadata"]["name"] = "rotate-talos-2025"
    op["metadata"]["creationTimestamp"] = "2025-11-02T10:00:00Z"
    op["status"]["completedAt"] = "2025-11-02T10:20:00Z"
    return op


def view(*, operations: list[Obj] | None = None, the_cluster: Obj | None = None) -> ClusterView:
    machines = [machine("demo-cp-1", "controlplane", "False", "CARotationInProgress"),
                machine("demo-cp-2", "controlplane", "False", "CARotationInProgress"),
                machine("demo-cp-3", "controlplane", "False", "CARotationInProgress"),
                machine("demo-worker-1", "worker", "True", "Converged")]
    return ClusterView(NS, "demo", the_cluster or cluster(), machines,
                       [rotation(), finished_rotation()] if operations is None else operations)


def test_a_cluster_awaiting_credentials_reads_as_the_golden_file() -> None:
    out = format_status(view(), NOW)
    if os.environ.get("ICHORD_UPDATE_GOLDEN"):
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text()
    # What the golden file must say, whatever its layout: the stage, the wait, and the next command.
    assert "stage AwaitingCredentials" in out
    assert "next: ichord cluster credentials demo -n ichord-system --acknowledge" in out
    assert "last finished: rotate-talos-2025 ca-rotation Completed" in out


def test_next_steps_by_state() -> None:
    paused = rotation(stage="Issuing", phase="Paused", reason="Paused", status="False",
                      message="held in Issuing: spec.paused is true", paused=True)
    assert next_step(paused, "demo", NS) == \
        "kubectl -n ichord-system patch top rotate --type merge -p '{\"spec\":{\"paused\":false}}'"
    blocked = rotation(stage="Issuing", phase="Paused", reason="Blocked", status="False",
                       message="machine demo-cp-2 (127.105.79.12) does not answer: connection refused")
    assert next_step(blocked, "demo", NS).startswith("read the message above and fix the cause")
    # A reason this version does not know (the integrator adds normal waits) is shown as it is, never guessed at.
    verifying = rotation(stage="Issuing", reason="VerifyingPass", message="verifying the Issuing pass on demo-cp-1")
    verifying["status"]["machines"] = [{"name": "demo-cp-1", "state": "Applied"},
                                       {"name": "demo-cp-2", "state": "Pending", "message": "next in order"}]
    assert next_step(verifying, "demo", NS) == "nothing: the daemon is working on it"
    out = format_status(view(operations=[verifying]), NOW)
    assert "waiting for: VerifyingPass: verifying the Issuing pass on demo-cp-1" in out
    # The operation's per-machine progress joins the machines table while it has any.
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  demo-")}
    assert "ROTATION" in out and rows["demo-cp-1"].endswith("Applied")
    assert rows["demo-cp-2"].endswith("Pending next in order") and rows["demo-cp-3"].endswith("(cluster)")


def test_a_completed_rotation_with_a_stale_bundle_asks_for_an_export() -> None:
    stale = cluster()
    stale["status"]["conditions"][1] = cond("BundleBackupStale", "True", "CARotated",
                                            "the CAs changed; export the bundle", "2026-12-01T16:59:00Z")
    out = format_status(view(operations=[finished_rotation()], the_cluster=stale), NOW)
    assert "none under way" in out
    assert out.rstrip().endswith("Next: ichord cluster bundle-export demo -n ichord-system")
    assert "Next:" not in format_status(view(operations=[finished_rotation()]), NOW)


def test_no_key_material_and_no_status_yet() -> None:
    bare = cluster()
    del bare["status"]
    op = rotation(message="refused: -----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIB\n-----END EC PRIVATE KEY-----")
    out = format_status(ClusterView(NS, "demo", bare, [], [op]), NOW)
    assert "no status yet" in out and "(no TalosMachine names this cluster)" in out
    assert "PRIVATE KEY" not in out and "MHcCAQEEIB" not in out
    # Machines with their own CA fingerprints show them; otherwise the cluster's, marked as such.
    m = machine("demo-cp-1", "controlplane", "True", "Converged")
    m["status"]["certificates"] = [{"name": "talos", "fingerprint": TALOS_NEW}]
    out = format_status(ClusterView(NS, "demo", cluster(), [m], []), NOW)
    assert f"talos={TALOS_NEW[:12]}" in out and "(cluster)" not in out


@pytest.mark.parametrize("phase", ["Completed", "Failed"])
def test_finished_operations_are_not_under_way(phase: str) -> None:
    op = copy.deepcopy(finished_rotation())
    op["status"]["phase"] = phase
    out = format_status(view(operations=[op]), NOW)
    assert "none under way" in out and f"last finished: rotate-talos-2025 ca-rotation {phase}" in out


def test_an_operation_under_way_shows_its_progress_and_eta() -> None:
    op = rotation()
    op["status"]["progress"] = {"done": 1, "total": 4, "steps": "1/4", "eta": "2026-12-01T17:12:00Z"}
    out = format_status(view(operations=[op]), NOW)
    assert "progress 1/4  eta 2026-12-01T17:12:00Z (in 12m)" in out
    op["status"]["progress"]["eta"] = "2026-12-01T16:59:00Z"
    assert "eta 2026-12-01T16:59:00Z (overdue)" in format_status(view(operations=[op]), NOW)
    del op["status"]["progress"]
    assert "progress" not in format_status(view(operations=[op]), NOW)  # written by an older ichord: nothing said
