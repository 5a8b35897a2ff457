"""Rewrite citations of documents outside the repository ("ADR 0120 §2", api.md, testing.md, ...) to docs/.

A migration helper: ichord's comments once cited the decision records of an earlier controller and design
documents kept beside the checkout; docs/decisions.md now holds those decisions in our words, numbered by anchor.
Run it after merging a branch that still cites them, then rewrap what ruff finds too long:

    python scripts/cite_docs.py [ROOT]

tests/unit/test_doc_citations.py fails on any citation left.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout.split()
SUFFIXES = (".py", ".yaml", ".yml", ".md", ".proto", ".pyi", ".tpl", ".json", ".sh", ".go", ".mod", ".txt",
            "Makefile", "Dockerfile")

#: What may follow "ADR nnnn" and belongs to the citation: sections, amendments, decisions, quoted titles.
TAIL_PARTS = [
    r"§\s?[\d.]+(?:-[\d.]+)?", r"Amendments? \d+(?: §[\d.\-]+)?", r"Am\. \d+", r"Decision \d+", r"D\d(?:-D?\d)?",
    r"trust amendments", r"amendments?", r"observation \d+", r"step \d+", r"(?:and )?lane [A-Z](?: \d+)?",
    r"\"[^\"\n]{1,60}\"", r"\d{4}-\d{2}-\d{2}", r"and Amendment \d+(?: §[\d.\-]+)?",
]
TAIL = r"(?:(?:,|;)? ?(?:" + "|".join(TAIL_PARTS) + r"))*"
ADR = re.compile(r"ADRs? (\d{4})((?:, \d{4})*)(" + TAIL + ")")

#: (ADR, a pattern of the words after it) -> the anchor in docs/decisions.md; the first match wins, "" matches all.
ANCHORS: list[tuple[str, str, str]] = [
    ("0120", r"Amendment 1|Am\. 1|§3", "etcd-reboot-roll"),
    ("0120", r"Amendment 2|Am\. 2", "abandon-or-hold"),
    ("0120", r"Amendment 3|Am\. 3|§4", "aggregator-ca"),
    ("0120", r"Amendment 4|Am\. 4|early acknowledgement|§5", "credentials-handoff"),
    ("0120", r"§1", "ca-rotation-targets"),
    ("0120", r"", "ca-rotation-passes"),
    ("0063", r"Decision 4|BundleBackupStale", "bundle-backup-stale"),
    ("0063", r"Decision 1|expiry", "expiry-alerting"),
    ("0063", r"trust", "trust-pool"),
    ("0063", r"(?i)amendment|CNI|\d{4}-\d{2}-\d{2}", "client-restarts"),
    ("0063", r"", "rotation-state"),
    ("0080", r"(?i)amendment", "apiserver-restart"),
    ("0080", r"", "config-rollout"),
    ("0095", r"", "config-rollout"),
    ("0091", r"", "credentials-handoff"),
]


def anchor(num: str, rest: str) -> str:
    for adr, pattern, name in ANCHORS:
        if adr == num and (not pattern or re.search(pattern, rest)):
            return name
    raise SystemExit(f"ADR {num} has no decision in docs/decisions.md: write one, then map it here")


def repl(m: re.Match[str]) -> str:
    num, more, rest = m.group(1), m.group(2), m.group(3)
    first = f"docs/decisions.md#{anchor(num, rest)}"
    if more:  # "ADR 0063, 0120": the rotation's state and passes
        extra = [f"docs/decisions.md#{anchor(n.strip(), '')}" for n in more.split(",") if n.strip()]
        return ", ".join([first, *extra])
    return first

OTHER = [
    (re.compile(r"\(ADR vocabulary\)"), "(docs/decisions.md's vocabulary)"),
    (re.compile(r", lane E and lane F\)"), ")"),
    (re.compile(r"talos-api-facts(?:\.md)? ?§ ?[\d.]+"), "Talos's API definitions"),
    (re.compile(r"talos-api-facts(?:\.md)?"), "Talos's API definitions"),
    (re.compile(r"(?<![/\w])testing\.md's invariants"), "the invariants of docs/decisions.md#invariants"),
    (re.compile(r"(?<![/\w])testing\.md \((\d)\)"), r"docs/decisions.md#invariants (\1)"),
    (re.compile(r"\(testing\.md (\d)\)"), r"(docs/decisions.md#invariants \1)"),
    (re.compile(r"(?<![/\w])testing\.md"), "docs/decisions.md#invariants"),
    (re.compile(r"\.\./shared/design/architecture\.md"), "docs/architecture.md"),
    (re.compile(r"(?<![/\w])architecture\.md"), "docs/architecture.md"),
    (re.compile(r"\(see simulators\.md\)"), "(README.md, test tiers)"),
    (re.compile(r", simulators\.md\)"), ")"),
    (re.compile(r"\(simulators\.md\)"), "(README.md, test tiers)"),
    (re.compile(r"\(docs: api\.md\)"), "(its fields: README.md, docs/runbook.md)"),
    (re.compile(r"api\.md \"([^\"]+)\""), r"README.md"),
    (re.compile(r"\(api\.md, the CRD\)"), "(the CRD)"),
    (re.compile(r"\(api\.md\)"), "(the CRDs)"),
    (re.compile(r"\(api\.md, "), "(the CRDs, "),
    (re.compile(r", api\.md\)"), ", the CRD)"),
    (re.compile(r"api\.md's printer columns"), "the printer columns"),
    (re.compile(r"the field names api\.md fixes as the contract"), "the field names the code relies on"),
    (re.compile(r"as api\.md defines it"), "as the TalosCluster/TalosMachine CRDs define it"),
    (re.compile(r"see api\.md for the shape of"), "see the CRD for the shape of"),
    (re.compile(r"Every Prometheus metric of api\.md"), "Every Prometheus metric ichord exports"),
]

changed: list[str] = []
for f in files:
    p = ROOT / f
    if (not (f.endswith(SUFFIXES) or p.name in SUFFIXES) or not p.is_file() or f.startswith("docs/")
            or f in ("scripts/cite_docs.py", "tests/unit/test_doc_citations.py")):
        continue
    try:
        s = p.read_text()
    except UnicodeDecodeError:
        continue
    new = ADR.sub(repl, s)
    for rx, to in OTHER:
        new = rx.sub(to, new)
    if new != s:
        p.write_text(new)
        changed.append(f)
print("\n".join(changed))
print(len(changed), "files")
