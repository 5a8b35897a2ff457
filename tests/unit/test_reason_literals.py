"""Issue 29: a reason ichord writes is named by its constant (ichord/api/names.py), never a string literal
spread over the code (cert-manager's habit): a reason is part of the API a user scripts against, and a typo in a
literal is a new reason nobody documented. Definitions of other constants with the same text (a kind's own reason
table, an error's reason) are fine; a literal used in a comparison, a call or a dict is not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = ROOT / "ichord" / "api" / "names.py"
SKIP = ("ichord/api/names.py", "ichord/sim/", "ichord/talos/proto/")


def reason_values() -> dict[str, str]:
    """Every reason constant's text -> its name (classes named *Reason and LockRefusal in names.py)."""
    out: dict[str, str] = {}
    for node in ast.parse(NAMES.read_text()).body:
        if isinstance(node, ast.ClassDef) and (node.name.endswith("Reason") or node.name == "LockRefusal"):
            for st in node.body:
                if (isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant)
                        and isinstance(st.value.value, str) and isinstance(st.targets[0], ast.Name)):
                    out.setdefault(st.value.value, f"{node.name}.{st.targets[0].id}")
    return out


def _definitions(tree: ast.AST) -> set[int]:
    """ids of literals that define a constant (NAME = "..." at module or class level) or list exports."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and (t.id.isupper() or t.id == "default_reason") for t in targets):
                ids.add(id(node.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            ids.update(id(c) for c in ast.walk(node.value))
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)  # A, B = "a", "b"
                and all(isinstance(t, ast.Tuple) for t in node.targets)):
            ids.update(id(c) for c in node.value.elts)
    return ids


def literal_uses() -> list[str]:
    values = reason_values()
    found = []
    for path in sorted((ROOT / "ichord").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(SKIP):
            continue
        tree = ast.parse(path.read_text())
        defs = _definitions(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values
                    and id(node) not in defs):
                found.append(f"{rel}:{node.lineno}: {node.value!r} is {values[node.value]}")
    return found


def test_reasons_are_named_by_their_constants() -> None:
    found = literal_uses()
    assert not found, "use the constant from ichord/api/names.py:\n" + "\n".join(found)


def test_the_check_sees_a_literal() -> None:
    assert "Converged" in reason_values() and "LockHeld" in reason_values()
