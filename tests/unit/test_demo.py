"""`ichord demo`'s pieces without the simulators: what it reads from a change, how it shows it, when it fails.

The whole demo runs in tests/e2e/test_demo.py.
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from typing import Any

import pytest

from ichord.demo import DemoFailed, Lines, LiveTable, Observer, Row, View, _expect_applies


def _env() -> Any:
    machines = [SimpleNamespace(name="m-cp-1", role="controlplane"), SimpleNamespace(name="m-worker-1", role="worker")]
    return SimpleNamespace(machines=machines, namespace="ns", node=lambda name: SimpleNamespace(name=f"node-{name}"))


def _change(name: str, status: str, reason: str, *, namespace: str = "ns", **fields: Any) -> tuple[Any, Any]:
    cond = {"type": "Ready", "status": status, "reason": reason, "message": f"{reason} because"}
    obj = {"metadata": {"name": name}, "status": {"conditions": [cond], **fields}}
    return SimpleNamespace(namespace=namespace, new=obj), SimpleNamespace(plural="talosmachines")


class Recorder(View):
    def __init__(self) -> None:
        super().__init__(io.StringIO())
        self.seen: list[tuple[str, str, str]] = []

    def transition(self, row: Row) -> None:
        self.seen.append((row.name, row.ready, row.reason))

    def applied(self, row: Row) -> None:
        self.seen.append((row.name, "apply", row.applies[-1][0]))


@pytest.mark.anyio
async def test_observer_reports_each_transition_once_and_each_apply() -> None:
    view = Recorder()
    obs = Observer(_env(), view)
    obs._on_change(*_change("m-cp-1", "True", "Converged", configHash="h1"))
    obs._on_change(*_change("m-cp-1", "True", "Converged", configHash="h1"))  # a status rewrite, no transition
    obs._on_change(*_change("m-cp-1", "True", "Converged", namespace="other"))  # another namespace's machine
    obs._on_change(*_change("stray", "False", "ClusterNotFound"))  # not one of the demo's machines
    obs._on_change(*_change("m-worker-1", "False", "RebootRequired", rebootPaths=["KernelModuleConfig x (added)"]))
    obs._on_event({"kind": "apply", "node": "node-m-cp-1", "config_hash": "h2", "mode": "NO_REBOOT"})
    obs._on_event({"kind": "reboot", "node": "node-m-cp-1"})
    assert view.seen == [("m-cp-1", "True", "Converged"), ("m-worker-1", "False", "RebootRequired"),
                         ("m-cp-1", "apply", "h2")]
    cp, worker = obs.rows["m-cp-1"], obs.rows["m-worker-1"]
    assert (cp.config_hash, cp.applies, cp.running) == ("h1", [("h2", "NO_REBOOT")], "h2")
    assert worker.reboot_paths == ["KernelModuleConfig x (added)"] and worker.message == "RebootRequired because"


@pytest.mark.anyio
async def test_until_wakes_on_a_change_and_names_the_late_machines_when_it_times_out() -> None:
    obs = Observer(_env(), Recorder())
    for name in obs.rows:
        obs._on_change(*_change(name, "True", "Converged"))
    await obs.until(lambda r: r.reason == "Converged", 1.0, "converged")
    obs._on_change(*_change("m-worker-1", "False", "Unreachable"))
    with pytest.raises(DemoFailed) as err:
        await obs.until(lambda r: r.reason == "Converged", 0.05, "every machine converged")
    assert str(err.value) == ("every machine converged did not happen within 0.05 s; still waiting for: "
                              "m-worker-1 (Unreachable); m-worker-1 says: Unreachable because")


@pytest.mark.anyio
async def test_expect_applies_names_the_node_and_what_it_accepted() -> None:
    obs = Observer(_env(), Recorder())
    obs.rows["m-cp-1"].applies = [("a" * 64, "NO_REBOOT"), ("a" * 64, "NO_REBOOT")]
    obs.rows["m-worker-1"].applies = [("b" * 64, "NO_REBOOT")]
    want = {"m-cp-1": "a" * 64, "m-worker-1": "b" * 64}
    with pytest.raises(DemoFailed) as err:
        _expect_applies(obs, lambda r: [(want[r.name], "NO_REBOOT")], "after the safe patch")
    assert str(err.value) == (f"m-cp-1: expected the applies NO_REBOOT {'a' * 12} after the safe patch, the node "
                              f"accepted: NO_REBOOT {'a' * 12}, NO_REBOOT {'a' * 12}")
    obs.rows["m-cp-1"].applies.pop()
    _expect_applies(obs, lambda r: [(want[r.name], "NO_REBOOT")], "after the safe patch")


def test_lines_prints_one_line_per_transition_with_the_reboot_paths() -> None:
    out = io.StringIO()
    view = Lines(out)
    row = Row("m-cp-1", "controlplane", "n", ready="False", reason="RebootRequired", reboot_paths=["A (added)", "B"])
    view.transition(row)
    row.applies.append(("c" * 64, "NO_REBOOT"))
    view.applied(row)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("m-cp-1           controlplane  Ready=False   RebootRequired  rebootPaths: A (added), B")
    assert lines[1].endswith(f"apply #1 NO_REBOOT, config {'c' * 12}")


def test_live_table_redraws_in_place_inside_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    view = LiveTable(out)
    view.rows = [Row("m-cp-1", "controlplane", "n", running="d" * 64), Row("m-worker-1", "worker", "n")]
    view.say("step one")
    view.rows[0].ready, view.rows[0].reason = "True", "Converged"
    view.transition(view.rows[0])
    view.refresh()
    view.refresh()  # nothing changed: nothing written
    text = out.getvalue()
    assert text.count("\x1b[3A\x1b[J") == 1 and "\x1b[32mTrue" in text
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert all(len(line) <= 39 for line in plain.splitlines())
    view.freeze()
    view.say("summary")  # below the frozen table: nothing erased, nothing redrawn
    view.close()
    assert out.getvalue()[len(text):] == "summary\n\x1b[?25h"
