"""The condition and Event reasons ichord writes, collected from its source (tests/unit/test_runbook.py).

Sources, by the AST of every module of ``ichord`` (the simulators excepted):

- every string constant of a class whose name ends in ``Reason`` or ``Refusal`` (``ichord/api/names.py``'s
  ReadyReason, EventReason, CARotationReason, ...; config's Refusal and RolloutReason), except RollReason
  (the roll's internal verdicts, which its callers map to their own reasons before anything is written);
- the reason constants of BundleSourceError (a Ready reason of the cluster and its machines);
- the module-level reason constants named in MODULE_CONSTANTS;
- a string literal passed as the reason of ``Condition(type, status, REASON, message)``, of
  ``recorder.record(ref, type, REASON, message)``, or as ``reason=``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]+$")
INTERNAL_CLASSES = {"RollReason"}
ERROR_CLASSES = {"BundleSourceError"}
#: Module-level constants that are reasons (path relative to ichord/ -> names).
MODULE_CONSTANTS = {
    "operations/backbone.py": {"BLOCKED", "PAUSED", "PLANNED", "IN_PROGRESS"},
    "operations/registry.py": {"UNSUPPORTED_KIND"},
    "operations/config/operation.py": {"ROLLING", "ROLLED_OUT"},
}


def _str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CAMEL.match(node.value):
        return node.value
    return None


def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def emitted_reasons() -> dict[str, str]:
    """reason -> where it is defined first (path:line)."""
    out: dict[str, str] = {}

    def add(value: str | None, path: Path, node: ast.AST) -> None:
        if value:
            out.setdefault(value, f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}")

    for path in sorted((ROOT / "ichord").rglob("*.py")):
        rel = path.relative_to(ROOT / "ichord")
        if rel.parts[0] == "sim" or "gen" in rel.parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        constants = MODULE_CONSTANTS.get(str(rel), set())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in constants
                                                    for t in node.targets):
                add(_str(node.value), path, node)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name not in INTERNAL_CLASSES and (
                    re.search(r"(Reason|Refusal)$", node.name) or node.name in ERROR_CLASSES):
                for item in node.body:
                    if isinstance(item, ast.Assign):
                        add(_str(item.value), path, item)
            elif isinstance(node, ast.Call):
                name = _func_name(node)
                if name in ("Condition", "record") and len(node.args) >= 3:
                    add(_str(node.args[2]), path, node)
                for kw in node.keywords:
                    if kw.arg == "reason":
                        add(_str(kw.value), path, node)
    return out
