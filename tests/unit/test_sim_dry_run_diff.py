"""The simulated dry run's config diff: matched only around what changed, still a unified diff that turns the running
configuration into the applied one."""

from __future__ import annotations

import difflib
import random
import re

from ichord.sim.talos.node import unified_diff

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def patched(old: list[str], diff: str) -> list[str]:
    """``old`` with the unified ``diff`` applied (every context and removed line checked against ``old``)."""
    if not diff:
        return list(old)
    lines = diff.split("\n")
    assert lines[0] == "--- a/config" and lines[1] == "+++ b/config"
    out: list[str] = []
    pos, i = 0, 2
    while i < len(lines):
        m = _HUNK.match(lines[i])
        assert m is not None, lines[i]
        length = int(m[2]) if m[2] is not None else 1
        start = int(m[1]) - 1 if length > 0 else int(m[1])
        assert start >= pos, diff
        out += old[pos:start]
        pos, i = start, i + 1
        while i < len(lines) and not lines[i].startswith("@@"):
            kind, body = lines[i][0], lines[i][1:]
            if kind in " -":
                assert old[pos] == body, (pos, body)
                pos += 1
            if kind in " +":
                out.append(body)
            i += 1
    return out + old[pos:]


def test_the_diff_of_a_certificate_change_is_difflibs_with_the_same_line_numbers() -> None:
    old = [f"    key{i}: value{i}" for i in range(300)]
    new = list(old)
    new[120] = "    crt: NEW"
    new.insert(200, "    - accepted")
    assert unified_diff(old, new) == "\n".join(difflib.unified_diff(old, new, "a/config", "b/config", lineterm=""))
    assert "@@ -118,7 +118,7 @@" in unified_diff(old, new)


def test_any_edit_yields_a_diff_that_turns_old_into_new() -> None:
    rnd = random.Random(19)
    for _ in range(2000):
        old = [f"line {rnd.randint(0, 40)}" for _ in range(rnd.randint(0, 120))]
        new = list(old)
        for _ in range(rnd.randint(0, 6)):
            at, op = rnd.randint(0, len(new)), rnd.random()
            if op < 0.4:
                new.insert(at, f"added {rnd.randint(0, 9)}")
            elif new and op < 0.7:
                new.pop(min(at, len(new) - 1))
            elif new:
                new[min(at, len(new) - 1)] = f"changed {rnd.randint(0, 9)}"
        diff = unified_diff(old, new)
        assert patched(old, diff) == new, (old, new, diff)
        assert (diff == "") == (old == new)
