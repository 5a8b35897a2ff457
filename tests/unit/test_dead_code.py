"""Issue 29: no unreferenced names in ichord/ (vulture over the product, its tests and scripts; a name used only by
a protocol or a library is allow-listed, with why, in tests/dead_code_allowlist.py). A name nobody uses is deleted,
not kept "for later": the next reader should not have to find out that it is dead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_unreferenced_names_in_ichord() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vulture", "ichord", "tests", "scripts", "--min-confidence", "60",
         "--exclude", "ichord/talos/proto/gen"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    findings = [line for line in result.stdout.splitlines() if line.startswith("ichord/")]
    assert not findings, "unreferenced names (delete them, or allow-list one with why):\n" + "\n".join(findings)
    assert result.returncode in (0, 3), result.stderr  # 3: vulture found dead code (in tests/, not checked here)
