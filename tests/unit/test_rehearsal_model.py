"""The rehearsal's duration model and what it notes of a live cluster the twin does not reproduce (pure units)."""

from __future__ import annotations

import pytest

from ichord.api.views import MachineView
from ichord.pki.bundle import generate_bundle
from ichord.rehearsal.live import LiveCluster, LiveNode, membership_notes
from ichord.rehearsal.model import DEFAULTS, DurationError, Durations, clock, most_at_once, predict
from ichord.rehearsal.run import Event


def test_durations_are_defaults_unless_given_and_bad_ones_are_refused() -> None:
    d = Durations.parse(["reboot=90-180", "apply=3"])
    assert d.ranges["reboot"] == (90.0, 180.0) and d.ranges["apply"] == (3.0, 3.0)
    assert d.source("reboot") == "given" and d.source("drain") == "default"
    assert d.ranges["drain"] == DEFAULTS["drain"][:2]
    for bad in ("reboot", "nap=3", "reboot=soon", "reboot=9-3", "reboot=-1"):
        with pytest.raises(DurationError, match="--duration"):
            Durations.parse([bad])


def test_the_prediction_sums_each_costed_step_in_order() -> None:
    events = [Event(0, "stage", detail="Rolling"), Event(1, "cordon", "w1"), Event(1, "evict", "w1"),
              Event(2, "apply", "w1"), Event(3, "down", "w1"), Event(4, "reboot", "w1")]
    d = Durations.parse(["stage=1", "drain=10-20", "apply=2", "reboot=100-200"])
    timed, total = predict(events, d)
    assert [t.at for t in timed] == [(1, 1), (11, 21), (11, 21), (13, 23), (13, 23), (113, 223)]
    assert total == (113, 223)
    assert (clock(45), clock(750), clock(3720)) == ("45s", "12m30s", "1h02m")


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
    assert predict(events, d)[1] == (1.0 + 400.0, 5.0 + 400.0)
    assert Durations().with_history([]) == Durations()
