"""The import direction of docs/architecture.md, enforced: a package imports only its own layer and the ones below.

    cli/daemon -> actors, watchers, trust, leader, server -> operations, machines -> render, talos, kube
    -> pki, api, settings (and the small shared modules beside them)

``sim`` may import pki, render, talos and api, never the daemon's runtime. Command-line modules
(``cli.py``, ``*_cli.py``) sit at the top whatever package they are in: they wire things together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "ichord"

#: Layer of each top-level package or module of ``ichord``; a module may import its own layer and lower.
LAYERS: dict[str, int] = {
    "errors": 0, "yamlio": 0, "metrics": 0, "settings": 0, "failpoints": 0, "contract": 0, "pki": 0, "api": 0,
    "log": 0, "malloc": 0, "gcpolicy": 0,
    "render": 1, "talos": 1, "kube": 1, "etcd_snapshot": 1,
    "operations": 2, "machines": 2,
    "actors": 3, "watchers": 3, "trust": 3, "leader": 3, "server": 3,
    "daemon": 4, "demo": 4, "credentials": 4, "cli": 4, "cluster_status": 4,
}
SIM_MAY_IMPORT = {"sim", "pki", "render", "talos", "api", "errors", "yamlio", "settings", "contract"}
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
