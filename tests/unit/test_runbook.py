"""docs/runbook.md has an entry for every reason ichord writes, and each entry says what to do.

The reasons are collected from the source (tests/unit/_reasons.py says how). A reason new to the code fails
here until docs/runbook.md has a row for it: one row in the table of its condition (or of the Events), first
cell the reason in backticks, last cell what to do.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit._reasons import emitted_reasons

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
ROW = re.compile(r"^\|\s*`([A-Za-z0-9]+)`\s*\|(.*)\|\s*$")


def runbook_rows() -> dict[str, list[str]]:
    """reason -> the cells after the reason of each of its rows (a reason may have a row in several tables)."""
    out: dict[str, list[str]] = {}
    for line in RUNBOOK.read_text().splitlines():
        m = ROW.match(line)
        if m:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
            out.setdefault(m.group(1), []).append(cells[-1])
    return out


EMITTED = emitted_reasons()
ROWS = runbook_rows()


def test_the_collector_sees_the_reasons() -> None:
    # A collector that finds nothing would pass anything: these are written on the happy path of every cluster.
    assert {"Converged", "Rotated", "AwaitingCredentials", "RotationCompleted", "Blocked", "RolledOut",
            "NothingToDo", "Reconciled", "SecretNotFound"} <= set(EMITTED)
    assert len(EMITTED) >= 70


@pytest.mark.parametrize("reason", sorted(EMITTED))
def test_every_reason_has_a_runbook_entry(reason: str) -> None:
    assert reason in ROWS, (f"{EMITTED[reason]} writes reason {reason!r}, which docs/runbook.md does not explain: "
                            "add a row `| `" + reason + "` | ... | what to do |` to the table it belongs to")
    assert all(len(todo) > 3 for todo in ROWS[reason]), f"the runbook row of {reason} says nothing to do"


def test_the_runbook_names_only_reasons_ichord_writes() -> None:
    stale = sorted(set(ROWS) - set(EMITTED))
    assert stale == [], f"docs/runbook.md explains reasons the code no longer writes: {stale}"
