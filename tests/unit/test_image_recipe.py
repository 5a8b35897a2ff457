"""The Dockerfile and the daemonless build (scripts/image.sh) describe the same image.

No Docker engine runs here, so scripts/image.sh (run by .ci/run) is what builds and starts the
image; this keeps the Dockerfile from drifting away from it: base, packages, venv, user,
entrypoint, environment, labels.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
SCRIPT = (ROOT / "scripts" / "image.sh").read_text()
PATH = "PATH=/opt/ichord/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_both_build_bookworm_python3_with_ichord_in_a_venv() -> None:
    assert "ARG BASE=debian:bookworm-slim" in DOCKERFILE and "SUITE=bookworm" in SCRIPT
    runtime = DOCKERFILE[DOCKERFILE.rindex("FROM ${BASE}"):]
    packages = re.search(r"apt-get install -y --no-install-recommends ([^\\\n]+)", runtime)
    assert packages and packages.group(1).split() == SCRIPT.split("PACKAGES=", 1)[1].split()[0].split(",")
    assert "python3 -m venv --without-pip /opt/ichord" in DOCKERFILE
    assert "python3 -m venv --without-pip /opt/ichord" in SCRIPT
    assert "-c constraints.txt" in DOCKERFILE and "-c constraints.txt" in SCRIPT


def test_both_run_ichord_as_65532_with_the_same_environment() -> None:
    assert 'ENTRYPOINT ["ichord"]' in DOCKERFILE and "--config.entrypoint ichord" in SCRIPT
    assert "USER 65532:65532" in DOCKERFILE and "--config.user 65532:65532" in SCRIPT
    nonroot = "nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin"
    assert nonroot in DOCKERFILE and nonroot in SCRIPT
    assert f"ENV {PATH}" in DOCKERFILE and f"--config.env {PATH}" in SCRIPT
    for var in ("PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"):
        assert var in DOCKERFILE and f"--config.env {var}" in SCRIPT


def test_both_label_the_image_per_oci() -> None:
    for label in ("title", "version", "revision", "licenses", "source", "base.name"):
        assert f"org.opencontainers.image.{label}=" in DOCKERFILE
        assert f"org.opencontainers.image.{label}=" in SCRIPT


def test_ci_runs_the_daemonless_build() -> None:
    assert "scripts/image.sh" in (ROOT / ".ci" / "run").read_text()
