"""Packaging facts that drift silently: one version everywhere, the protobuf floor of the generated
code, the constraints file covering every requirement, the licence."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import ichord
from ichord import yamlio

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "ichord" / "talos" / "proto" / "gen"
_RUNTIME_CHECK = re.compile(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),"
                            r"\s*(\d+),")


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> list[Requirement]:
    project = pyproject()["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]]


def test_one_version_for_the_package_the_chart_and_the_image() -> None:
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ichord.__version__"}
    version = ichord.__version__
    # The installed metadata is what `pip install` built from the same attribute (stale only without reinstall).
    assert importlib.metadata.version("ichord") == version
    chart = yamlio.load((ROOT / "helm" / "ichord" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    # The image tag defaults to appVersion; the image build takes its version from the wheel's metadata.
    values = yamlio.load((ROOT / "helm" / "ichord" / "values.yaml").read_text())
    assert values["image"]["tag"] == ""
    # Helm needs SemVer, Python PEP 440: a version both read the same way.
    assert re.fullmatch(r"\d+\.\d+\.\d+", version) and str(Version(version)) == version


def test_the_protobuf_floor_is_the_runtime_the_generated_code_checks_for() -> None:
    generated = set()
    for path in GEN.rglob("*_pb2.py"):
        m = _RUNTIME_CHECK.search(path.read_text())
        assert m, f"{path} has no runtime version check"
        generated.add(Version(".".join(m.groups())))
    assert generated, "no generated protobuf modules found"
    newest = max(generated)
    (protobuf,) = [r for r in requirements() if r.name == "protobuf"]
    assert newest in protobuf.specifier
    # The floor is exactly the generating version: an older runtime fails the import-time check.
    older = Version(f"{newest.major}.{newest.minor}.{newest.micro - 1}" if newest.micro else
                    f"{newest.major}.{newest.minor - 1}.99")
    assert older not in protobuf.specifier
    assert Version(f"{newest.major + 1}.0.0") not in protobuf.specifier  # gencode refuses another major


def test_the_constraints_pin_every_requirement_within_its_range() -> None:
    pins: dict[str, Version] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not name==version"
            pins[canonicalize_name(name)] = Version(version)
    for req in requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt does not pin {req.name}"
        assert pins[name] in req.specifier, f"constraints.txt pins {req.name}=={pins[name]} outside {req.specifier}"
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_the_licence_is_the_apache_2_text_pyproject_declares() -> None:
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
