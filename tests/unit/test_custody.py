"""The pure parts of guarded deletes and key custody: who holds a delete, and when the bundle Secret must be restored
(each row a way the Secret can lose the rotation's keys, and the ways it cannot)."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.api import names
from ichord.api.carotation import Stage
from ichord.api.views import OperationView
from ichord.kube.reads import SecretData
from ichord.operations.ca_rotation.custody import Kept, bundle_problem, restore_message
from ichord.operations.ca_rotation.plan import certificates_status
from ichord.operations.ca_rotation.status import CA_ROTATION
from ichord.operations.guard import holders, holds
from ichord.pki.bundle import SecretsBundle, generate_bundle
from ichord.pki.rotation import Rotation, Target, generate_rotation

Obj = dict[str, Any]
TARGETS = (Target.TALOS, Target.KUBERNETES)


@pytest.fixture(scope="module")
def bundle() -> SecretsBundle:
    return generate_bundle()


@pytest.fixture(scope="module")
def rotation() -> Rotation:
    return generate_rotation(TARGETS)


def _op(stage: str = "", phase: str = "", finalizers: list[str] | None = None, deleting: bool = False) -> OperationView:
    meta: Obj = {"name": "rotate", "namespace": "ns", "uid": "u1", "finalizers": finalizers or []}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return OperationView.of({"metadata": meta, "spec": {"kind": "ca-rotation", "clusterRef": {"name": "demo"}},
                             "status": {"phase": phase, "caRotation": {"stage": stage}}})


@pytest.mark.parametrize(("op", "held"), [
    (_op(), False),  # created, not started (a plan only)
    (_op(finalizers=[names.CA_ROTATION_FINALIZER]), True),  # started, blocked in preflight: it holds the lock
    (_op("Issuing", "InProgress", [names.CA_ROTATION_FINALIZER]), True),
    (_op("Issuing", "InProgress"), True),  # its own finalizer forced off: still running
    (_op("Accepting", "InProgress", deleting=True), False),  # abandoned: finalizer gone, about to vanish
    (_op("Done", "Completed", [names.CA_ROTATION_FINALIZER]), False),  # completed, let-go pending
    (_op("", "Failed"), False),
])
def test_which_operations_hold_a_delete(op: OperationView, held: bool) -> None:
    assert holds(op, CA_ROTATION) is held
    assert holds(op, None) is False  # a kind this ichord does not run holds nothing


def test_the_hold_names_what_ends_it() -> None:
    [early] = holders([_op("Accepting", "InProgress", [names.CA_ROTATION_FINALIZER])], lambda _k: CA_ROTATION)
    assert "kubectl -n ns delete talosoperation rotate" in early.what_ends_it()
    [late] = holders([_op("Dropping", "InProgress", [names.CA_ROTATION_FINALIZER])], lambda _k: CA_ROTATION)
    assert "past its point of no return" in late.what_ends_it() and "kubectl" not in late.what_ends_it()


def _secret(data: dict[str, bytes], *, deleting: bool = False) -> SecretData:
    return SecretData("demo-secrets", "ns", "1", data, deleting=deleting)


def _status(bundle: SecretsBundle, rotation: Rotation, stage: Stage) -> Obj:
    return {"certificates": certificates_status(bundle, rotation, stage)}


def test_a_whole_bundle_needs_no_restore_in_any_stage(bundle: SecretsBundle, rotation: Rotation) -> None:
    raw = bundle.to_yaml().encode()
    data = {names.SECRETS_KEY: raw, names.ROTATION_KEY: rotation.to_yaml().encode()}
    kept = Kept("ns", "c", "u", raw, data[names.ROTATION_KEY], "ns", "demo-secrets")
    for stage in (Stage.ACCEPTING, Stage.AWAITING_CREDENTIALS, Stage.ISSUING, Stage.DROPPING):
        assert bundle_problem(_secret(data), bundle, rotation, _status(bundle, rotation, stage), stage, kept) is None
    replaced = rotation.apply_to(bundle)
    after = {names.SECRETS_KEY: replaced.to_yaml().encode()}
    for stage in (Stage.DROPPING, Stage.FINALIZING, Stage.DONE):  # Dropping: replaced, status not told yet
        assert bundle_problem(_secret(after), replaced, None, _status(bundle, rotation, Stage.DROPPING), stage,
                              kept) is None
    # The copy restores exactly what the replacement wrote.
    assert kept.restored(Stage.FINALIZING) == {names.SECRETS_KEY: after[names.SECRETS_KEY], names.ROTATION_KEY: None}
    assert kept.restored(Stage.ISSUING) == data


def test_every_way_of_losing_the_keys_asks_for_the_restore(bundle: SecretsBundle, rotation: Rotation) -> None:
    raw = bundle.to_yaml().encode()
    data = {names.SECRETS_KEY: raw, names.ROTATION_KEY: rotation.to_yaml().encode()}
    status = _status(bundle, rotation, Stage.ISSUING)
    kept = Kept("ns", "c", "u", raw, data[names.ROTATION_KEY], "ns", "demo-secrets")
    other_bundle = generate_bundle()
    other_rotation = generate_rotation(TARGETS)
    cases = {
        "being deleted": (_secret(data, deleting=True), bundle, rotation),
        f"holds no {names.ROTATION_KEY}": (_secret({names.SECRETS_KEY: raw}), bundle, None),
        "other CAs than the ones this rotation gave": (
            _secret({**data, names.ROTATION_KEY: other_rotation.to_yaml().encode()}), bundle, other_rotation),
        "other CAs than the ones this rotation started from": (
            _secret({**data, names.SECRETS_KEY: other_bundle.to_yaml().encode()}), other_bundle, rotation),
        "not the one this rotation started from": (
            _secret({**data, names.SECRETS_KEY: raw + b"\n# edited\n"}), bundle, rotation),
    }
    for expected, (secret, read_bundle, read_rotation) in cases.items():
        problem = bundle_problem(secret, read_bundle, read_rotation, status, Stage.ISSUING, kept)
        assert problem is not None and expected in problem, (expected, problem)
    # Past the replacement, an older secrets.yaml put back is caught too.
    problem = bundle_problem(_secret({names.SECRETS_KEY: raw}), bundle, None, status, Stage.FINALIZING, kept)
    assert problem is not None and "does not hold the new CAs" in problem


def test_the_message_names_the_copy_and_the_command_never_a_key(bundle: SecretsBundle, rotation: Rotation) -> None:
    text = restore_message("the bundle Secret ns/demo-secrets is gone", "ns", "u1", "demo", kept=True)
    assert "Secret ns/ichord-custody-u1" in text and "`ichord cluster restore-bundle demo -n ns`" in text
    assert "PRIVATE KEY" not in text
    lost = restore_message("gone", "ns", "u1", "demo", kept=False)
    assert "does not exist" in lost and "restore-bundle" not in lost  # never a command that cannot work
    assert "PRIVATE" not in repr(Kept("ns", "c", "u", bundle.to_yaml().encode(), None, "ns", "b"))
