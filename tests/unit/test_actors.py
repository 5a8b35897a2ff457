"""Mailbox, actor loop and supervisor (pure units, real event loop, millisecond timings)."""

from __future__ import annotations

from collections.abc import Hashable

import anyio
import pytest

from ichord.actors.actor import ClusterActor, Supervisor
from ichord.actors.mailbox import Mailbox
from ichord.operations.outcome import Blocked, Done, Failed, Outcome, Requeue, earliest, next_delay

pytestmark = pytest.mark.anyio


async def test_mailbox_coalesces_by_key_and_never_blocks() -> None:
    box = Mailbox()
    for i in range(10_000):
        box.put("machine/a", f"update {i}")
    box.put("machine/b", "added")
    assert len(box) == 2
    taken = await box.take(0)
    assert taken == {"machine/a": "update 9999", "machine/b": "added"}
    assert len(box) == 0
    with anyio.fail_after(1):
        assert await box.take(0.01) == {}


async def test_mailbox_wakes_a_waiter() -> None:
    box = Mailbox()
    got: list[dict[Hashable, str]] = []

    async def waiter() -> None:
        got.append(await box.take())

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.01)
        box.put("k", "r")
    assert got == [{"k": "r"}]


def test_outcome_delays() -> None:
    assert next_delay(Done()) is None
    assert next_delay(Failed("Invalid")) is None
    assert next_delay(Requeue(5)) == 5
    assert next_delay(Blocked("Unreachable", "node down", 30)) == 30
    assert earliest(None, 30, 5, None) == 5
    assert earliest(None, None) is None


async def test_actor_runs_at_start_on_messages_and_on_requeue() -> None:
    calls: list[dict[Hashable, str]] = []
    outcomes: list[Outcome] = [Requeue(0.02), Done(), Done()]

    async def step(messages: dict[Hashable, str]) -> Outcome:
        calls.append(messages)
        return outcomes[min(len(calls) - 1, len(outcomes) - 1)]

    actor = ClusterActor("ns/c", step)
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.run)
        await anyio.sleep(0.1)
        assert calls == [{}, {}]  # the start, then the requeue; Done waits for a message
        actor.tell("m1", "changed")
        actor.tell("m1", "changed again")
        await anyio.sleep(0.05)
        actor.stop()
    assert calls[2] == {"m1": "changed again"}
    assert len(calls) == 3


async def test_requested_wakeup_earlier_than_outcome_wins() -> None:
    calls = 0

    async def step(_messages: dict[Hashable, str]) -> Outcome:
        nonlocal calls
        calls += 1
        actor.request_wakeup(0.01)
        return Requeue(60)

    actor = ClusterActor("ns/c", step)
    async with anyio.create_task_group() as tg:
        tg.start_soon(actor.run)
        await anyio.sleep(0.1)
        actor.stop()
    assert calls >= 3


async def test_supervisor_restarts_a_crashed_actor_and_keeps_the_others() -> None:
    seen: dict[str, int] = {"a": 0, "b": 0}

    def step_for(key: str, _actor: ClusterActor):  # type: ignore[no-untyped-def]
        async def step(_messages: dict[Hashable, str]) -> Outcome:
            seen[key] += 1
            if key == "a" and seen[key] <= 2:
                raise RuntimeError("boom")
            return Done()

        return step

    async with anyio.create_task_group() as tg:
        sup = Supervisor(tg, step_for, backoff_initial=0.01, backoff_max=0.05)
        sup.ensure("a")
        sup.ensure("b")
        await anyio.sleep(0.15)
        assert sup.restarts == {"a": 2}
        assert seen["a"] == 3 and seen["b"] == 1
        sup.tell("b", "m", "changed")
        await anyio.sleep(0.02)
        assert seen["b"] == 2
        sup.stop("a")
        sup.stop("b")
        assert sup.actors == {}


async def test_on_idle_runs_after_a_step_only_when_no_other_step_runs() -> None:
    limiter = anyio.CapacityLimiter(2)
    idle: list[str] = []
    release = anyio.Event()

    async def slow(_messages: dict[Hashable, str]) -> Outcome:
        await release.wait()
        return Done()

    async def quick(_messages: dict[Hashable, str]) -> Outcome:
        return Done()

    a = ClusterActor("ns/a", slow, limiter=limiter, on_idle=lambda: idle.append("a"))
    b = ClusterActor("ns/b", quick, limiter=limiter, on_idle=lambda: idle.append("b"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await anyio.sleep(0.01)  # a's step holds a token
        tg.start_soon(b.run)
        await anyio.sleep(0.01)
        assert b.steps == 1 and idle == []  # b finished while a still ran: not idle
        release.set()
        await anyio.sleep(0.01)
        assert idle == ["a"]  # a was the last step running
        a.stop()
        b.stop()


async def test_a_message_told_while_the_step_waits_its_turn_is_that_steps_news() -> None:
    """A thousand actors wake at start-up and queue behind the step limiter; a change told to one meanwhile (the
    bundle Secrets' first list lands) is read by the step it waited for: one step, not a second one after it."""
    calls: list[dict[Hashable, str]] = []

    async def step(messages: dict[Hashable, str]) -> Outcome:
        calls.append(dict(messages))
        return Done()

    limiter = anyio.CapacityLimiter(1)
    actor = ClusterActor("ns/c", step, limiter=limiter)
    async with anyio.create_task_group() as tg:
        await limiter.acquire()  # another actor's step holds the only slot
        tg.start_soon(actor.run)
        await anyio.sleep(0.02)  # the actor woke (its start) and waits for the slot
        assert calls == []
        actor.tell(("Secret", "bundle"), "ADDED")
        limiter.release()
        await anyio.sleep(0.05)
        actor.stop()
    assert calls == [{("Secret", "bundle"): "ADDED"}]
    assert actor.steps == 1
