"""No comment, docstring or message cites a document that is not in the repository.

ichord's reasons live in docs/ (decisions.md, architecture.md, runbook.md). A citation of a decision record of
another project ("ADR nnnn"), of a design document beside the checkout, or of an anchor docs/ does not have
fails here. Upstream Talos sample files that tests read at run time from ``../shared/reference/talos`` are data,
not citations, and stay allowed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).relative_to(ROOT).as_posix()
#: Files that name the old citations on purpose: this test.
EXEMPT = {SELF}

#: Citations of documents outside the repository.
OUTSIDE = [
    re.compile(r"\bADRs? ?\d{3,4}\b"),
    re.compile(r"(?<![\w/])(?:api|testing|simulators|style|architecture)\.md\b"),
    re.compile(r"talos-api-facts"),
    re.compile(r"shared/(?:design|spec)\b"),
]
DOC_LINK = re.compile(r"\bdocs/([\w.-]+\.md)(?:#([\w-]+))?")
TEXT = (".py", ".pyi", ".proto", ".yaml", ".yml", ".json", ".md", ".sh", ".go", ".tpl", ".txt", ".toml", ".cfg")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split()
    return sorted(f for f in out if (f.endswith(TEXT) or Path(f).name in ("Makefile", "Dockerfile"))
                  and not f.startswith("docs/") and f not in EXEMPT and (ROOT / f).is_file())


def anchors(doc: Path) -> set[str]:
    text = doc.read_text()
    ids = set(re.findall(r'<a id="([\w-]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        ids.add(re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-"))
    return ids


FILES = tracked_files()


def test_docs_exist() -> None:
    for name in ("runbook.md", "architecture.md", "decisions.md"):
        assert (ROOT / "docs" / name).is_file(), name
    assert len(FILES) > 100  # the scan reads the repository, not an empty list


@pytest.mark.parametrize("path", FILES)
def test_no_citation_of_a_document_outside_the_repository(path: str) -> None:
    text = (ROOT / path).read_text(errors="replace")
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        bad += [f"{path}:{n}: {m.group(0)!r}" for rx in OUTSIDE for m in rx.finditer(line)]
        for m in DOC_LINK.finditer(line):
            doc = ROOT / "docs" / m.group(1)
            if not doc.is_file():
                bad.append(f"{path}:{n}: docs/{m.group(1)} does not exist")
            elif m.group(2) and m.group(2) not in anchors(doc):
                bad.append(f"{path}:{n}: docs/{m.group(1)} has no anchor #{m.group(2)}")
    assert bad == [], "cite docs/ instead:\n" + "\n".join(bad)
