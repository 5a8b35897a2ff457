"""`ichord demo` runs to the end without input and prints no secret material."""

from __future__ import annotations

from pathlib import Path

import pytest

from ichord.cli import main
from ichord.pki.bundle import SecretsBundle


def test_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("demo: done")
    assert out.count("Dropping == render of the replaced bundle: yes") == 4
    bundle = SecretsBundle.load(tmp_path / "secrets.yaml")
    for secret in bundle.secret_values():
        assert secret not in out
    assert "BEGIN" not in out and "LS0tLS1" not in out
