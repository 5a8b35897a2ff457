from __future__ import annotations

import subprocess
import sys

import pytest

from ichord.failpoints import EXIT_CODE, FailpointSpecError, parse


def test_parse() -> None:
    assert parse("") == {}
    assert parse("a, b:3") == {"a": 1, "b": 3}
    with pytest.raises(FailpointSpecError):
        parse("a:x")
    with pytest.raises(FailpointSpecError):
        parse("a:0")


def test_process_exits_137_on_the_nth_hit() -> None:
    code = "from ichord.failpoints import failpoint\nfor i in range(5):\n    print(i, flush=True)\n    failpoint('x')\n"
    proc = subprocess.run([sys.executable, "-c", code], env={"ICHORD_FAILPOINTS": "x:3"}, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == EXIT_CODE
    assert proc.stdout.split() == ["0", "1", "2"]
    assert "failpoint x reached" in proc.stderr
