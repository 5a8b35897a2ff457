"""The import direction of docs/architecture.md, enforced: a package imports only its own layer and the ones below.

    cli/daemon -> actors, watchers, trust, leader, server -> operations, machines -> render, talos, kube
    -> pki, api, settings (and the small shared modules beside them)

``sim`` may import pki, render, talos and api, never the daemon's runtime. Command-line modules
(``cli.py``, ``*_cli.py``) sit at the top whatever package they are in: they wire things together.

Inside ``operations``, the kinds' packages (``ca_rotation``, ``config``) never import each other, and
``operations/managed`` (what every kind's step uses on the managed cluster) imports no kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "ichord"

#: Layer of each top-level package or module of ``ichord``; a module may import its own layer and lower.
LAYERS: dict[str, int] = {
    "errors": 0, "yamlio": 0, "metrics": 0, "settings": 0, "failpoints": 0, "contract": 0, "pki": 0, "api": 0,
    "log": 0, "malloc": 0, "gcpolicy": 0, "jsoncopy": 0, "safefile": 0, "cliargs": 0,
    "render": 1, "talos": 1, "kube": 1, "etcd_snapshot": 1,
    "operations": 2, "machines": 2,
    "actors": 3, "watchers": 3, "trust": 3, "leader": 3, "server": 3,
    "daemon": 4, "demo": 4, "rehearsal": 4, "credentials": 4, "cli": 4, "cluster_status": 4,
}
SIM_MAY_IMPORT = {"sim", "pki", "render", "talos", "api", "errors", "yamlio", "settings", "contract", "jsoncopy",
                  "safefile", "cliargs"}
#: Independence inside a layer (issue 13): these never import each other in the direction named.
NEVER: dict[str, set[str]] = {
    "pki": {"api"},  # api's views and conditions use pki; pki stands alone (the api <-> pki cycle is gone)
    "machines": {"operations"},  # the machine reconciler reports; operations never run through it
    "operations": {"actors", "machines", "trust", "daemon"},
    "render": {"talos", "kube"},
    "talos": {"render", "kube"},
    "kube": {"render", "talos"},
}
TOP = 4

OPERATIONS = ROOT / "operations"
#: The packages of ``operations`` (issue 29): each kind's stands alone (a kind never imports another), and what
#: every kind's step shares (its context and inputs, the managed cluster's clients, /readyz, etcd health,
#: render-and-compare, the drain) imports no kind. Every package of ``operations`` is one or the other.
OPERATION_KINDS = {"ca_rotation", "config"}
SHARED_BY_KINDS = {"managed"}


def _unit(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _is_cli(path: Path) -> bool:
    return path.name == "cli.py" or path.name.endswith("_cli.py") or path.parent.name == "demo"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "ichord" and len(parts) > 1:
                out.add(parts[1])
    return out


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "_gen" not in p.parts and "__pycache__" not in p.parts)


def test_every_unit_has_a_layer() -> None:
    units = {_unit(p) for p in _sources()} - {"__init__", "sim", "py"}
    missing = sorted(u for u in units if u not in LAYERS and not u.endswith("_cli"))
    assert missing == [], f"give these a layer in LAYERS: {missing}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_down_only(path: Path) -> None:
    unit = _unit(path)
    imported = _imports(path) - {unit}
    if unit == "sim":
        if _is_cli(path):
            imported -= {"cli"}
        assert imported <= SIM_MAY_IMPORT, f"sim imports the daemon's runtime: {sorted(imported - SIM_MAY_IMPORT)}"
        return
    layer = TOP if _is_cli(path) or unit.endswith("_cli") else LAYERS.get(unit, TOP)
    upward = sorted(m for m in imported if m != "sim" and LAYERS.get(m, TOP) > layer)
    assert upward == [], f"{path.relative_to(ROOT)} (layer {layer}) imports upward: {upward}"
    if "sim" in imported:
        assert layer == TOP, f"{path.relative_to(ROOT)} imports the simulators outside a command"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_independence_rules(path: Path) -> None:
    unit = _unit(path)
    if _is_cli(path):
        return
    forbidden = sorted(_imports(path) & NEVER.get(unit, set()))
    assert forbidden == [], f"{path.relative_to(ROOT)} ({unit}) must not import {forbidden}"


def _operations_package(path: Path) -> str | None:
    """The package of ``operations`` that ``path`` belongs to (None: a module of ``operations`` itself, or outside)."""
    if not path.is_relative_to(OPERATIONS):
        return None
    parts = path.relative_to(OPERATIONS).parts
    return parts[0] if len(parts) > 1 else None


def _operations_packages_imported(path: Path) -> set[str]:
    """The packages of ``ichord.operations`` that ``path`` imports, as a module or as a name, absolutely or
    relatively."""
    here = ["ichord", *path.parent.relative_to(ROOT).parts]
    dotted: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            dotted += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            dotted += [module, *(f"{module}.{a.name}" for a in node.names)]
    out: set[str] = set()
    for name in dotted:
        parts = name.split(".")
        if parts[:2] == ["ichord", "operations"] and len(parts) > 2 and (OPERATIONS / parts[2]).is_dir():
            out.add(parts[2])
    return out


def test_every_operations_package_is_a_kind_or_shared() -> None:
    packages = {p.name for p in OPERATIONS.iterdir() if (p / "__init__.py").exists()}
    unsorted = sorted(packages - OPERATION_KINDS - SHARED_BY_KINDS)
    assert unsorted == [], f"name these in OPERATION_KINDS or SHARED_BY_KINDS: {unsorted}"


@pytest.mark.parametrize("path", [p for p in _sources() if _operations_package(p) is not None],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_operation_kinds_never_import_each_other(path: Path) -> None:
    package = _operations_package(path)
    kinds = sorted((_operations_packages_imported(path) - {package}) & OPERATION_KINDS)
    if package in SHARED_BY_KINDS:
        assert kinds == [], f"{path.relative_to(ROOT)} is shared by every kind and must not import the kind {kinds}"
    else:
        assert kinds == [], (f"{path.relative_to(ROOT)} (kind {package}) imports the kind {kinds}: what both use "
                             "belongs in operations/managed")
