"""Issue 29: one writer of an operation's phase, condition and the Event of a transition (operations/op_status.py).

On the simulator's API server, through the registry and the error policy as the cluster actor calls them: the
write is decided on the object as read for it (a Warning only when the write sent moved the condition, never
again because the step's copy was stale) and stamped with the step's clock, not the wall clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from ichord.api import names
from ichord.api.conditions import find
from ichord.api.views import OperationView
from ichord.errors import IchordError
from ichord.kube import crds
from ichord.kube.client import KubeClient
from ichord.kube.events import EventRecorder, ObjectRef
from ichord.kube.status import update_status
from ichord.operations import backbone, deletion, intent
from ichord.operations.kinds import default_registry
from ichord.operations.registry import UNSUPPORTED_KIND, Registry
from ichord.operations.scope import ClusterScope
from ichord.operations.step_errors import StepRetries
from ichord.settings import Timing
from ichord.sim.combined import SimEnvironment
from tests.integration._config_world import World, world_on
from tests.integration._subject import OperationSubject

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

Obj = dict[str, Any]
#: The step's clock, far from the wall clock: a stamp from the wall clock cannot pass for it.
STEP_CLOCK = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)


class Said(EventRecorder):
    """The Events a step records, as it records them (the recorder's sending is tested in tests/unit)."""

    def __init__(self, world: World) -> None:
        super().__init__(world.kube, instance="test")
        self.said: list[tuple[str, str, str]] = []

    def record(self, obj: ObjectRef, type_: str, reason: str, message: str) -> None:
        self.said.append((obj.name, type_, reason))


@pytest.fixture
async def world(env: SimEnvironment) -> AsyncIterator[World]:
    async for w in world_on(env, replace(Timing().scaled(0.01), step_retry_bound=0.0)):
        yield w


async def _create(world: World, name: str) -> OperationView:
    obj = await crds.operations(world.kube).create(world.env.namespace, {"metadata": {"name": name}, "spec": {
        "clusterRef": {"name": world.env.cluster_name}, "kind": names.KIND_CONFIG, "paused": False}})
    return OperationView.of(obj)


def _scope(world: World, recorder: EventRecorder, ops: list[OperationView]) -> ClusterScope:
    return ClusterScope(world.kube, world.env.namespace, world.env.namespace, world.env.cluster_name, None, [], ops,
                        recorder, world.timing, now=lambda: STEP_CLOCK)


async def test_an_unknown_kinds_condition_and_phase_are_stamped_with_the_steps_clock(world: World) -> None:
    op = await _create(world, "later")
    said = Said(world)
    await Registry().advance_all(_scope(world, said, [op]))  # a registry that runs no kind: "config" is unknown
    status = (await world.op("later"))["status"]
    assert status["phase"] == names.Phase.PENDING
    stamp = STEP_CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ")
    for ctype in (names.CONFIG_ROLLOUT, "Succeeded"):
        cond = find(status["conditions"], ctype)
        assert cond is not None and cond["lastTransitionTime"] == stamp, (ctype, cond)
    assert find(status["conditions"], names.CONFIG_ROLLOUT)["reason"] == UNSUPPORTED_KIND  # type: ignore[index]
    assert said.said == [("later", "Warning", UNSUPPORTED_KIND)]


async def test_an_unknown_kind_said_already_is_not_warned_again_from_a_stale_copy(world: World) -> None:
    """Another step (this process's, or a previous leader's) said it after the copy was taken: no second Warning."""
    stale = await _create(world, "later")
    first, second = Said(world), Said(world)
    await Registry().advance_all(_scope(world, first, [stale]))
    await Registry().advance_all(_scope(world, second, [stale]))  # the copy predates the first write
    assert first.said == [("later", "Warning", UNSUPPORTED_KIND)]
    assert second.said == []


async def test_steps_failing_raised_already_is_neither_rewritten_nor_warned_again_from_a_stale_copy(
        world: World) -> None:
    stale = await _create(world, "cfg")
    first, second = Said(world), Said(world)
    await StepRetries().failed(_scope(world, first, [stale]), stale, IchordError("the API did not answer"))
    raised = await world.op("cfg")
    await StepRetries().failed(_scope(world, second, [stale]), stale, IchordError("the API did not answer"))
    assert first.said == [("cfg", "Warning", names.EventReason.STEPS_FAILING)]
    assert second.said == []
    again = await world.op("cfg")
    assert again["metadata"]["resourceVersion"] == raised["metadata"]["resourceVersion"]  # nothing written
    cond = find(again["status"]["conditions"], names.STEPS_FAILING)
    assert cond is not None and cond["status"] == "True" and cond["lastTransitionTime"] == STEP_CLOCK.strftime(
        "%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Step:
    """What backbone.Context asks of a step (managed.context.StepContext is the daemon's)."""

    kube: KubeClient
    namespace: str
    recorder: EventRecorder
    timing: Timing

    def now(self) -> dt.datetime:
        return STEP_CLOCK

    def observe(self, obj: Obj) -> None:
        """Nothing keeps a scope here."""


async def test_blocked_for_a_cause_said_already_is_not_warned_again_from_a_stale_copy(world: World) -> None:
    """One Warning per cause, decided on the object written: a step holding an older copy (read before another
    step blocked the operation for the same cause) rewrites nothing it would Warn about."""
    stale = (await _create(world, "cfg")).obj
    kind = default_registry().kinds[names.KIND_CONFIG].spec
    first, second = Said(world), Said(world)
    cause = "machine cp-1 does not answer"
    # A subject each: a write keeps its subject current, and the second step must hold the stale copy.
    await backbone.blocked(_Step(world.kube, world.env.namespace, first, world.timing), kind,
                           OperationSubject(stale), cause)
    await backbone.blocked(_Step(world.kube, world.env.namespace, second, world.timing), kind,
                           OperationSubject(stale), cause)
    assert first.said == [("cfg", "Warning", names.EventReason.OPERATION_BLOCKED)]
    assert second.said == []
    status = (await world.op("cfg"))["status"]
    assert status["phase"] == names.Phase.PAUSED
    cond = find(status["conditions"], names.CONFIG_ROLLOUT)
    assert cond is not None and (cond["reason"], cond["message"]) == ("Blocked", cause)
    assert cond["lastTransitionTime"] == STEP_CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ")

    another = "machine cp-2 does not answer"  # a new cause is a new Warning, even from the stale copy
    await backbone.blocked(_Step(world.kube, world.env.namespace, second, world.timing), kind, OperationSubject(stale),
                           another)
    assert second.said == [("cfg", "Warning", names.EventReason.OPERATION_BLOCKED)]


async def test_a_stage_entered_is_stamped_with_the_steps_clock(world: World) -> None:
    """status.stageSince (and the stage's duration measured from it) is on the step's clock, as the conditions are."""
    subject = OperationSubject((await _create(world, "cfg")).obj)
    step = _Step(world.kube, world.env.namespace, Said(world), world.timing)
    await backbone.write(step, subject, lambda s: s.__setitem__("stage", "Rolling"))
    assert subject.op["status"]["stageSince"] == STEP_CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_refused_operation_is_failed_with_one_warning_from_the_write_that_failed_it(world: World) -> None:
    stale = (await _create(world, "cfg")).obj
    kind = default_registry().kinds[names.KIND_CONFIG].spec
    first, second = Said(world), Said(world)
    why, invalid = "machine.env: expected a mapping", names.EventReason.INVALID_CONFIG
    for said in (first, second):  # the second from a copy older than the first write
        await backbone.fail(_Step(world.kube, world.env.namespace, said, world.timing), kind, stale, invalid, why,
                            event_reason=invalid)
    assert first.said == [("cfg", "Warning", names.EventReason.INVALID_CONFIG)]
    assert second.said == []
    status = (await world.op("cfg"))["status"]
    assert status["phase"] == names.Phase.FAILED and status["observedGeneration"] == 1
    cond = find(status["conditions"], names.CONFIG_ROLLOUT)
    assert cond is not None and (cond["status"], cond["reason"], cond["message"]) == ("False", invalid, why)


async def test_a_deletion_held_already_is_neither_rewritten_nor_warned_again_from_a_stale_copy(world: World) -> None:
    """DeletionHeld goes through the one writer too: a step holding a copy read before another step held the
    deletion writes nothing and posts no second Warning; the condition is stamped with the step's clock."""
    stale = (await _create(world, "cfg")).obj
    kind = default_registry().kinds[names.KIND_CONFIG].spec
    first, second = Said(world), Said(world)
    for said in (first, second):  # a subject each: the second step holds the copy older than the first write
        await deletion.hold_deletion(_Step(world.kube, world.env.namespace, said, world.timing), kind,
                                     OperationSubject(stale), "Rolling", "the nodes already run the new config")
    assert first.said == [("cfg", "Warning", names.EventReason.DELETION_HELD)]
    assert second.said == []
    cond = find((await world.op("cfg"))["status"]["conditions"], names.DELETION_HELD)
    assert cond is not None and (cond["status"], cond["reason"]) == (
        "True", names.DeletionHeldReason.PAST_POINT_OF_NO_RETURN)
    assert cond["lastTransitionTime"] == STEP_CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "deleted in Rolling, past the point of no return" in cond["message"]


async def test_a_spec_change_is_said_once_on_the_steps_clock_and_lowered_when_put_back(world: World) -> None:
    """SpecChangeIgnored goes through the one writer: raised with one Warning (a second step holding a copy read
    before the first write posts none), stamped with the step's clock, lowered with no Event when the spec is put
    back."""
    await _create(world, "cfg")
    ops = crds.operations(world.kube)
    accepted = intent.intent_of((await world.op("cfg"))["spec"])
    await update_status(ops, world.env.namespace, "cfg", lambda s, _o: {**s, intent.ACCEPTED_SPEC: accepted})
    stale = OperationView.of(await ops.patch(world.env.namespace, "cfg", {"spec": {"maxUnavailable": 2}}))
    first, second = Said(world), Said(world)
    for said in (first, second):
        view = await intent.keep(_scope(world, said, [stale]), stale)
        assert "maxUnavailable" not in view.spec  # the steps run on the accepted spec
    assert first.said == [("cfg", "Warning", names.EventReason.SPEC_CHANGE_IGNORED)]
    assert second.said == []
    raised = await world.op("cfg")
    cond = find(raised["status"]["conditions"], names.SPEC_CHANGE_IGNORED)
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", names.SpecChangeReason.IGNORED)
    assert cond["message"].startswith("spec.maxUnavailable changed after the operation started")
    assert cond["lastTransitionTime"] == STEP_CLOCK.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cond["observedGeneration"] == raised["metadata"]["generation"]

    back = OperationView.of(await ops.patch(world.env.namespace, "cfg", {"spec": {"maxUnavailable": None}}))
    lowered = Said(world)
    await intent.keep(_scope(world, lowered, [back]), back)
    cond = find((await world.op("cfg"))["status"]["conditions"], names.SPEC_CHANGE_IGNORED)
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", names.SpecChangeReason.AS_ACCEPTED)
    assert lowered.said == []
