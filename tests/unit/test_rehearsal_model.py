"""The rehearsal's duration model and what it notes of a live cluster the twin does not reproduce (pure units)."""

from __future__ import annotations

import pytest

from ichord.api.views import MachineView
from ichord.pki.bundle import generate_bundle
from ichord.rehearsal.live import LiveCluster, LiveNode, membership_notes
from ichord.rehearsal.model import DEFAULTS, DurationError, Durations, clock, most_at_once, predict, schedule
from ichord.rehearsal.run import Event


def test_durations_are_defaults_unless_given_and_bad_ones_are_refused() -> None:
    d = Durations.parse(["reboot=90-180", "apply=3"])
    assert d.ranges["reboot"] == (90.0, 180.0) and d.ranges["apply"] == (3.0, 3.0)
    assert d.source("reboot") == "given" and d.source("drain") == "default"
    assert d.ranges["drain"] == DEFAULTS["drain"][:2]
    for bad in ("reboot", "nap=3", "reboot=soon", "reboot=9-3", "reboot=-1", "reboot=nan", "reboot=inf",
                "reboot=1-inf", "reboot=-inf-3"):
        with pytest.raises(DurationError, match="--duration"):
            Durations.parse([bad])


def test_the_prediction_sums_each_costed_step_in_order() -> None:
    events = [Event(0, "stage", detail="Rolling"), Event(1, "cordon", "w1"), Event(1, "evict", "w1"),
              Event(2, "apply", "w1"), Event(3, "down", "w1"), Event(4, "reboot", "w1")]
    d = Durations.parse(["stage=1", "drain=10-20", "apply=2", "reboot=100-200", "overhead=3"])
    timed, total = predict(events, d)
    assert [t.at for t in timed] == [(1, 1), (14, 24), (14, 24), (16, 26), (16, 26), (116, 226)]
    assert total == (116, 226)
    assert (clock(45), clock(750), clock(3720)) == ("45s", "12m30s", "1h02m")


def _drain(t: float, node: str, reboot: bool = True) -> list[Event]:
    return [Event(t, "cordon", node), Event(t, "apply", node), *([Event(t, "reboot", node)] if reboot else []),
            Event(t, "uncordon", node)]


def test_drains_the_twin_held_together_roll_in_that_many_slots_each_node_in_the_next_free_one() -> None:
    """Four workers two at a time in the twin (w1 and w2, then w3 when w1 finished, w4 when w2 did); in the model
    w1 is slow, so w3 takes w2's slot and w4 waits for the first of w3 and w1: the makespan is the slots', never
    the sum."""
    events = [Event(0, "stage", detail="Rolling"), Event(0, "cordon", "w1"), Event(0, "cordon", "w2"),
              Event(0, "apply", "w1"), Event(0, "apply", "w2"), Event(1, "reboot", "w1"), Event(1, "reboot", "w2"),
              Event(1, "uncordon", "w1"), *_drain(2, "w3")[:2], Event(2, "uncordon", "w2"), *_drain(3, "w4")[:2],
              Event(4, "reboot", "w3"), Event(4, "uncordon", "w3"), *_drain(5, "w4")[2:],
              Event(6, "stage", detail="Done")]
    reboot = {"w1": 100.0, "w2": 10.0, "w3": 10.0, "w4": 10.0}
    costs = {"stage": 0.0, "drain": 1.0, "apply": 1.0, "overhead": 0.0}

    def cost(kind: str, node: str) -> float:
        return reboot[node] if kind == "reboot" else costs[kind]

    at = schedule(events, cost)
    by = {(e.kind, e.node): t for e, t in zip(events, at, strict=True)}
    assert by[("uncordon", "w1")] == 102 and by[("uncordon", "w2")] == 12
    assert by[("uncordon", "w3")] == 12 + 12  # w2's slot, free at 12
    assert by[("uncordon", "w4")] == 24 + 12  # w3's slot again: w1 still reboots
    assert max(at) == by[("stage", "")] == 102  # the slow w1 ends it; the sum would be 138
    serial = [e for n in ("w1", "w2", "w3", "w4") for e in _drain(0, n)]
    assert max(schedule(serial, cost)) == 102 + 12 * 3  # drains the twin did one at a time stay one at a time


def test_each_node_step_costs_the_daemons_overhead_once() -> None:
    events = [Event(0, "stage", detail="Issuing"), Event(0, "apply", "cp-1"), Event(0, "apiserver_restart", "cp-1"),
              Event(0, "apply", "cp-2"), Event(0, "apiserver_restart", "cp-2"), *_drain(0, "cp-1", reboot=False)]
    d = Durations.parse(["stage=0", "apply=1", "apiserver_restart=10", "drain=5", "overhead=2-4"])
    assert predict(events, d)[1] == (3 * 2 + 2 * 11 + 6, 3 * 4 + 2 * 11 + 6)
    assert d.source("overhead") == "given" and Durations().source("overhead") == "default"


def _live(nodes: list[LiveNode]) -> LiveCluster:
    return LiveCluster("ns", "c", {}, [], [], generate_bundle(), nodes={n.machine: n for n in nodes})


def _cp(name: str) -> MachineView:
    return MachineView.of({"metadata": {"name": name, "namespace": "ns"},
                           "spec": {"clusterRef": {"name": "c"}, "role": "controlplane", "address": "10.0.0.1"}})


def test_notes_say_what_the_twin_does_not_reproduce() -> None:
    same = ("cp-1", "cp-2")
    whole = [LiveNode("cp-1", "controlplane", "a", "v1.14.5", b"", same),
             LiveNode("cp-2", "controlplane", "b", "v1.14.5", b"", same)]
    assert membership_notes(_live(whole), [_cp("cp-1"), _cp("cp-2")]) == []
    mixed = [whole[0], LiveNode("cp-2", "controlplane", "b", "v1.14.4", b"", ("cp-2",))]
    notes = membership_notes(_live(mixed), [_cp("cp-1"), _cp("cp-2")])
    assert any("different Talos versions (v1.14.4, v1.14.5)" in n for n in notes)
    assert any("do not agree on etcd's members" in n for n in notes)
    short = [LiveNode("cp-1", "controlplane", "a", "v1.14.5", b"", ("cp-1",)),
             LiveNode("cp-2", "controlplane", "b", "v1.14.5", b"", ("cp-1",))]
    assert membership_notes(_live(short), [_cp("cp-1"), _cp("cp-2")]) == [
        "etcd has 1 member(s) for 2 control plane(s); the twin has one per control plane"]


def test_most_at_once_counts_nodes_cordoned_together() -> None:
    serial = [Event(0, "cordon", "a"), Event(1, "uncordon", "a"), Event(2, "cordon", "b"), Event(3, "uncordon", "b")]
    assert most_at_once(serial) == 1
    wave = [Event(0, "cordon", "a"), Event(0, "cordon", "b"), Event(1, "uncordon", "a"), Event(1, "cordon", "c"),
            Event(2, "uncordon", "b")]
    assert most_at_once(wave) == 2


def test_history_sets_the_ranges_not_given_and_each_nodes_own_and_says_so() -> None:
    apply_mid = sum(DEFAULTS["apply"][:2]) / 2
    past = [{"status": {"progress": {"observed": [
        {"node": "cp-1", "step": "apply+reboot", "seconds": 100 + apply_mid},
        {"node": "cp-2", "step": "apply+reboot", "seconds": 400 + apply_mid},
        {"node": "cp-1", "step": "apply+apiserver_restart", "seconds": 30 + apply_mid},
        {"node": None, "step": "stage", "seconds": 999},  # a ca-rotation stage spans its reboots: not credited
        {"node": "cp-3", "step": "nap", "seconds": 5}, "not an entry"]}}}, {"status": {}}, {}]
    d = Durations.parse(["apiserver_restart=20"]).with_history(past)
    assert d.ranges["reboot"] == (100.0, 400.0) and d.source("reboot") == "history of 2 step(s)"
    assert d.ranges["apiserver_restart"] == (20.0, 20.0) and d.source("apiserver_restart") == "given"
    assert d.ranges["stage"] == DEFAULTS["stage"][:2] and d.source("stage") == "default"
    assert (d.of("reboot", "cp-2"), d.of("reboot", "cp-9")) == ((400.0, 400.0), (100.0, 400.0))
    assert d.of("apiserver_restart", "cp-1") == (20.0, 20.0)  # given beats a node's history
    events = [Event(0, "apply", "cp-2"), Event(1, "reboot", "cp-2")]
    assert predict(events, d)[1] == (1.0 + 1.0 + 400.0, 10.0 + 5.0 + 400.0)  # and the overhead (default)
    assert Durations().with_history([]) == Durations()
