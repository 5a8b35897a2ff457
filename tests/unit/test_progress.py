"""status.progress (operations/progress.py): steps done of the total and an ETA from the duration model scaled by
the run's pace, on a step clock (never the wall clock) driven by per-node durations."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from ichord.api.conditions import now_rfc3339, parse_time
from ichord.api.operation_kinds import CA_ROTATION, CONFIG
from ichord.operations.ca_rotation.passes import APISERVER_KEY, APISERVER_RESTARTED
from ichord.operations.progress import history_of, note_progress, predicted_seconds

Obj = dict[str, Any]
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _config_status(planned: list[tuple[str, str]], done: list[str]) -> Obj:
    return {"stage": "Rolling", "startedAt": now_rfc3339(START),
            "plan": {"machines": [{"name": n, "role": r, "reboots": True} for n, r in planned]},
            "roll": {"done": done}}


PLANNED = [("cp-1", "controlplane"), ("cp-2", "controlplane"), ("cp-3", "controlplane"),
           ("w-1", "worker"), ("w-2", "worker"), ("w-3", "worker")]


@pytest.mark.parametrize("seconds", [
    {"cp-1": 100, "cp-2": 110, "cp-3": 95, "w-1": 150, "w-2": 160, "w-3": 140},   # even
    {"cp-1": 300, "cp-2": 280, "cp-3": 320, "w-1": 400, "w-2": 380, "w-3": 420},  # a slow cluster
    {"cp-1": 40, "cp-2": 45, "cp-3": 50, "w-1": 70, "w-2": 65, "w-3": 75},        # a fast one
])
def test_the_eta_at_halfway_is_within_20_percent_of_the_time_left(seconds: dict[str, int]) -> None:
    clock = START
    done: list[str] = []
    progress: list[tuple[int, int]] = []
    eta_halfway: dt.datetime | None = None
    halfway_at = START
    status = _config_status(PLANNED, done)
    note_progress(CONFIG, status, clock)
    for name, _role in PLANNED:
        clock += dt.timedelta(seconds=seconds[name])
        done.append(name)
        status = {**_config_status(PLANNED, done), "progress": status["progress"]}  # as read for the next write
        note_progress(CONFIG, status, clock)
        progress.append((status["progress"]["done"], status["progress"]["total"]))
        if len(done) == len(PLANNED) // 2:
            eta_halfway, halfway_at = parse_time(status["progress"]["eta"]), clock
    assert progress == [(i, 6) for i in range(1, 7)]
    assert eta_halfway is not None
    actual_left = (clock - halfway_at).total_seconds()
    predicted_left = (eta_halfway - halfway_at).total_seconds()
    assert abs(predicted_left - actual_left) <= 0.2 * actual_left, (predicted_left, actual_left)


def test_before_the_first_step_the_eta_is_the_models_and_none_once_done() -> None:
    status = _config_status(PLANNED, [])
    note_progress(CONFIG, status, START)
    assert status["progress"]["steps"] == "0/6"
    # The model's middles: 3 control planes (apply 3 + reboot 150) and 3 workers (drain 65 more).
    assert (parse_time(status["progress"]["eta"]) - START).total_seconds() == pytest.approx(3 * 153 + 3 * 218, abs=1)
    # A later write that counts nothing leaves the progress as read (so a write with nothing else stays unsent).
    again = {**_config_status(PLANNED, []), "progress": dict(status["progress"])}
    note_progress(CONFIG, again, START + dt.timedelta(minutes=5))
    assert again["progress"] == status["progress"]
    status = {**_config_status(PLANNED, [n for n, _ in PLANNED]), "stage": "Done", "progress": status["progress"]}
    note_progress(CONFIG, status, START + dt.timedelta(hours=1))
    assert {k: status["progress"][k] for k in ("done", "total", "steps", "eta")} == {
        "done": 6, "total": 6, "steps": "6/6", "eta": None}  # None: the merge patch removes the ETA


def test_each_step_is_observed_once_per_node_and_kind_and_the_record_stays_bounded() -> None:
    planned = [(f"w-{i}", "worker") for i in range(150)]
    status = _config_status(planned, [])
    note_progress(CONFIG, status, START)
    clock = START
    for i in range(150):
        clock += dt.timedelta(seconds=10 + i % 3)
        status = {**_config_status(planned, [n for n, _ in planned[:i + 1]]), "progress": status["progress"]}
        note_progress(CONFIG, status, clock)
        status = {**status, "message": "a write that counts nothing new"}
        note_progress(CONFIG, status, clock + dt.timedelta(seconds=1))  # no step done: nothing observed
    observed = status["progress"]["observed"]
    assert len(observed) == 100  # the latest kept
    assert [o["node"] for o in observed] == [f"w-{i}" for i in range(50, 150)]
    assert {o["step"] for o in observed} == {"drain+apply+reboot"}
    assert [o["seconds"] for o in observed[:3]] == [10 + 50 % 3, 10 + 51 % 3, 10 + 52 % 3]


def test_a_kind_observed_in_this_run_takes_its_observed_mean_in_the_eta() -> None:
    status = _config_status(PLANNED, ["cp-1"])
    status["progress"] = {"done": 1, "total": 6, "lastDoneAt": "2026-01-01T00:00:20.000000Z",
                          "observed": [{"node": "cp-1", "step": "apply+reboot", "seconds": 20}]}
    status["roll"]["done"] = ["cp-1"]
    note_progress(CONFIG, status, START + dt.timedelta(seconds=20))
    # cp-2, cp-3 at the observed 20 s; the workers at the model's 218 s scaled by the pace (20 s for 153 s of model).
    left = (parse_time(status["progress"]["eta"]) - START).total_seconds() - 20
    assert left == pytest.approx(2 * 20 + 3 * 218 * 20 / 153, abs=1)


def test_a_ca_rotation_counts_its_planned_stages() -> None:
    status: Obj = {"startedAt": now_rfc3339(START), "plan": {"stages": ["Accepting", "Issuing", "Dropping",
                                                                      "Finalizing"]},
                   "caRotation": {"stage": "Dropping"}}
    note_progress(CA_ROTATION, status, START + dt.timedelta(seconds=60))
    assert status["progress"]["steps"] == "2/4"
    status = {**status, "caRotation": {"stage": "Finalizing"}}
    note_progress(CA_ROTATION, status, START + dt.timedelta(seconds=90))
    assert status["progress"]["observed"] == [  # a stage names no node; those counted together share the time
        {"step": "stage", "seconds": 30.0, "startedAt": f"2026-01-01T00:0{m}:{s}.000000Z"}
        for m, s in (("0", "00"), ("0", "30"), ("1", "00"))]
    assert (parse_time(status["progress"]["eta"]) - START).total_seconds() == pytest.approx(120, abs=1)


def test_a_status_without_a_plan_gets_no_progress() -> None:
    status: Obj = {"stage": ""}
    note_progress(CONFIG, status, START)
    assert "progress" not in status


def test_a_step_this_run_has_not_seen_takes_its_nodes_time_from_the_clusters_past_operations() -> None:
    past = [{"metadata": {"uid": "old"}, "status": {"progress": {"observed": [
        {"node": "w-1", "step": "drain+apply+reboot", "seconds": 30},
        {"node": "w-2", "step": "drain+apply+reboot", "seconds": 90},
        {"node": "cp-1", "step": "apply+reboot", "seconds": 999}]}}},
        {"metadata": {"uid": "this"}, "status": {"progress": {"observed": [
            {"node": "w-3", "step": "drain+apply+reboot", "seconds": 5000}]}}}, {"metadata": {}}]
    history = history_of(past, "this")
    assert [o["node"] for o in history] == ["w-1", "w-2", "cp-1"]  # its own run is not its history
    status = _config_status(PLANNED, ["cp-1", "cp-2", "cp-3"])
    status["progress"] = {"done": 3, "total": 6, "lastDoneAt": "2026-01-01T00:01:00.000000Z",
                          "observed": [{"node": n, "step": "apply+reboot", "seconds": 20}
                                       for n in ("cp-1", "cp-2", "cp-3")]}
    note_progress(CONFIG, status, START + dt.timedelta(seconds=60), history)
    left = (parse_time(status["progress"]["eta"]) - START).total_seconds() - 60
    # w-1 and w-2 their own past 30 s and 90 s; w-3, with none of its own, the kind's past mean (60 s).
    assert left == pytest.approx(30 + 90 + 60, abs=1)


def _at(seconds: float) -> str:
    return (START + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _workers_status(done: list[str], slots: dict[str, Obj], progress: Obj | None = None) -> Obj:
    status = _config_status([("cp-1", "controlplane"), ("w-1", "worker"), ("w-2", "worker"), ("w-3", "worker")],
                            done)
    status["plan"]["workerBound"] = {"atOnce": 2}
    status["workerRolls"] = slots
    if progress is not None:
        status["progress"] = progress
    return status


def test_parallel_workers_are_each_timed_from_their_own_slot_cut_at_their_marks() -> None:
    status = _workers_status(["cp-1"], {}, {"done": 1, "total": 4, "lastDoneAt": _at(100)})
    note_progress(CONFIG, status, START + dt.timedelta(seconds=100))
    # w-1 and w-2 taken together at 100 s; their applies and reboots begin at their own times.
    slots = {"w-1": {"startedAt": _at(100), "stagedAt": _at(110), "requestedAt": _at(112)},
             "w-2": {"startedAt": _at(100), "stagedAt": _at(120), "requestedAt": _at(121)}}
    status = _workers_status(["cp-1"], slots, status["progress"])
    note_progress(CONFIG, status, START + dt.timedelta(seconds=122), carried=True)
    assert set(status["progress"]["running"]) == {"w-1", "w-2"}  # kept: the slots go in the write that ends them
    # w-1 is back at 160 s (its slot gone in that write), w-2 at 171 s.
    status = _workers_status(["cp-1", "w-1"], {"w-2": slots["w-2"]}, status["progress"])
    note_progress(CONFIG, status, START + dt.timedelta(seconds=160))
    assert status["progress"]["running"] == {"w-1": None, "w-2": {"start": _at(100), "apply": _at(120),
                                                                 "reboot": _at(121)}}  # null: merge-patch removal
    status["progress"]["running"] = {"w-2": status["progress"]["running"]["w-2"]}  # as the server returns it
    status = _workers_status(["cp-1", "w-1", "w-2"], {}, status["progress"])
    note_progress(CONFIG, status, START + dt.timedelta(seconds=171))
    parts = [(o["node"], o["step"], o["seconds"], o["startedAt"]) for o in status["progress"]["observed"]]
    assert parts[-6:] == [("w-1", "drain", 10.0, _at(100)), ("w-1", "apply", 2.0, _at(110)),
                          ("w-1", "reboot", 48.0, _at(112)),
                          ("w-2", "drain", 20.0, _at(100)), ("w-2", "apply", 1.0, _at(120)),
                          ("w-2", "reboot", 50.0, _at(121))]  # not the 11 s between the two completions


def test_a_sequential_machine_is_timed_from_the_step_before_and_cut_at_the_roll_marker() -> None:
    status = _config_status(PLANNED[:2], [], )
    note_progress(CONFIG, status, START)
    status = {**_config_status(PLANNED[:2], []), "progress": status["progress"]}
    status["roll"] = {"rebooting": "cp-1", "stagedAt": _at(30), "requestedAt": _at(31), "done": []}
    note_progress(CONFIG, status, START + dt.timedelta(seconds=31), carried=False)
    assert "running" not in status["progress"]  # a write sent for nothing else carries no new mark
    status = {**_config_status(PLANNED[:2], ["cp-1"]), "progress": status["progress"]}
    status["roll"] = {"stagedAt": _at(30), "requestedAt": _at(31), "done": ["cp-1"]}  # the marker's times stay
    note_progress(CONFIG, status, START + dt.timedelta(seconds=91))
    assert [(o["step"], o["seconds"]) for o in status["progress"]["observed"]] == [
        ("drain", 30.0), ("apply", 1.0), ("reboot", 60.0)]


def test_with_workers_two_at_once_the_eta_runs_them_on_two_slots() -> None:
    observed = [{"node": "cp-1", "step": k, "seconds": t} for k, t in (("drain", 4), ("apply", 1), ("reboot", 45))]
    status = _workers_status(["cp-1"], {}, {"done": 1, "total": 4, "lastDoneAt": _at(50), "observed": observed})
    status["progress"]["done"] = 0  # counted now
    status["progress"].pop("lastDoneAt")
    note_progress(CONFIG, status, START + dt.timedelta(seconds=50))
    left = (parse_time(status["progress"]["eta"]) - START).total_seconds() - 50
    # w-1 and w-2 side by side (50 s), then w-3, the plan's last, alone (50 s): 100 s, not 150 s.
    assert left == pytest.approx(100, abs=1)


def test_an_older_operations_whole_step_record_is_still_read() -> None:
    past = [{"metadata": {"uid": "old"}, "status": {"progress": {"observed": [
        {"node": "w-1", "step": "drain+apply+reboot", "seconds": 70}]}}}]
    status = _config_status([("w-0", "worker"), ("w-1", "worker")], ["w-0"])
    status["progress"] = {"done": 1, "total": 2, "lastDoneAt": _at(10)}
    note_progress(CONFIG, status, START + dt.timedelta(seconds=10), history_of(past, "new"))
    # w-1's drain, apply and reboot are unknown in this run: its own whole step of before stands for them.
    assert (parse_time(status["progress"]["eta"]) - START).total_seconds() - 10 == pytest.approx(70, abs=1)


def test_a_ca_rotation_counts_its_etcd_rolls_reboots_per_pass() -> None:
    plan = {"stages": ["Accepting", "Issuing", "Dropping", "Finalizing"],
            "machines": [{"name": f"cp-{i}", "role": "controlplane", "reboots": True} for i in (1, 2, 3)]
            + [{"name": "w-1", "role": "worker", "reboots": False}]}
    status: Obj = {"startedAt": now_rfc3339(START), "plan": plan,
                   "caRotation": {"stage": "Issuing", "etcdRestarted": ["cp-1"], "etcdRebooting": "cp-2",
                                  "etcdRestartedAt": _at(200)}}
    steps = CA_ROTATION.steps(status)
    assert [(s.key or "stage", s.done) for s in steps] == [
        ("Accepting/cp-1/reboot", True), ("Accepting/cp-2/reboot", True), ("Accepting/cp-3/reboot", True),
        ("stage", True),
        ("Issuing/cp-1/reboot", True), ("Issuing/cp-2/reboot", False), ("Issuing/cp-3/reboot", False),
        ("stage", False),
        ("Dropping/cp-1/reboot", False), ("Dropping/cp-2/reboot", False), ("Dropping/cp-3/reboot", False),
        ("stage", False), ("stage", False)]
    assert steps[5].marks == (("reboot", _at(200)),) and steps[6].marks == ()  # the reboot under way is cp-2's
    note_progress(CA_ROTATION, status, START + dt.timedelta(seconds=210))
    assert status["progress"]["steps"] == "5/13"


def test_a_ca_rotation_counts_each_kube_apiserver_restart_of_its_passes() -> None:
    plan = {"targets": ["kubernetes-aggregator"], "stages": ["Accepting", "Issuing", "Dropping", "Finalizing"],
            "machines": [{"name": f"cp-{i}", "role": "controlplane", "reboots": False} for i in (1, 2)]
            + [{"name": "w-1", "role": "worker", "reboots": False}]}
    status: Obj = {"startedAt": now_rfc3339(START), "plan": plan,
                   "machines": [{"name": "cp-1", "state": "Issuing", APISERVER_KEY: APISERVER_RESTARTED},
                                {"name": "cp-2", "state": "APIServerRestarting"}],
                   "caRotation": {"stage": "Issuing", "apiServerInstances": [
                       {"machine": "cp-1", "appliedAt": "2026-01-01T00:01:00Z"},
                       {"machine": "cp-2", "appliedAt": "2026-01-01T00:01:30Z"}]}}
    steps = CA_ROTATION.steps(status)
    assert [(s.key or "stage", s.done) for s in steps] == [
        ("Accepting/cp-1/kube-apiserver", True), ("Accepting/cp-2/kube-apiserver", True), ("stage", True),
        ("Issuing/cp-1/kube-apiserver", True), ("Issuing/cp-2/kube-apiserver", False), ("stage", False),
        ("Dropping/cp-1/kube-apiserver", False), ("Dropping/cp-2/kube-apiserver", False), ("stage", False),
        ("stage", False)]
    assert steps[4].marks == (("apiserver_restart", "2026-01-01T00:01:30Z"),)
    assert steps[4].parts == ("checks", "apiserver_restart")
    # A talos-only rotation restarts no kube-apiserver: its stages alone.
    assert len(CA_ROTATION.steps({**status, "plan": {**plan, "targets": ["talos"]}})) == 4


def test_a_nodes_predicted_step_is_this_runs_or_the_clusters_past_and_none_before_either() -> None:
    """What a maintenance window asks before a node starts (operations/backbone.py predicted_step): None (the
    caller's default) until a step of its kinds was timed; then this run's, else the cluster's past operations'."""
    status = _config_status(PLANNED, [])
    assert predicted_seconds(CONFIG, status, "w-1") is None
    past = [{"node": "w-1", "step": "drain", "seconds": 10.0}, {"node": "w-1", "step": "apply", "seconds": 2.0},
            {"node": "w-1", "step": "reboot", "seconds": 30.0}]
    assert predicted_seconds(CONFIG, status, "w-1", past) == pytest.approx(42.0)
    status["progress"] = {"observed": [{"node": "w-2", "step": "drain", "seconds": 4.0},
                                       {"node": "w-2", "step": "apply", "seconds": 1.0},
                                       {"node": "w-2", "step": "reboot", "seconds": 20.0}]}
    assert predicted_seconds(CONFIG, status, "w-1") == pytest.approx(25.0)  # this run's, beside the others
    assert predicted_seconds(CONFIG, _config_status(PLANNED, ["w-1"]), "w-1") is None  # done: no next step
