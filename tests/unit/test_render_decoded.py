"""render/decoded.py: the values Talos's decoder rewrites, rewritten alike (the oracle comparison is
tests/real/test_strict_lists_oracle.py)."""

from __future__ import annotations

from ruamel.yaml.scalarstring import LiteralScalarString

from ichord.render import decoded


def test_inline_manifest_contents_lose_leading_control_whitespace_only() -> None:
    doc = {"version": "v1alpha1", "cluster": {"inlineManifests": [
        {"name": "a", "contents": LiteralScalarString("\n\nkind: A\n")},
        {"name": "b", "contents": "\t\r\n\v\f kind: B\n"},
        {"name": "c", "contents": " kind: C"},
        {"name": "d"},
        "not a mapping",
    ]}}
    manifests = decoded.normalize(doc)["cluster"]["inlineManifests"]
    assert manifests[0]["contents"] == "kind: A\n"
    assert isinstance(manifests[0]["contents"], LiteralScalarString)
    assert manifests[1]["contents"] == " kind: B\n"
    assert manifests[2]["contents"] == " kind: C"
    assert manifests[3] == {"name": "d"}


def test_typed_documents_and_other_fields_are_untouched() -> None:
    typed = {"apiVersion": "v1alpha1", "kind": "KubeInlineManifestConfig", "name": "x", "manifest": "\nkind: A"}
    assert decoded.normalize(dict(typed)) == typed
    files = {"version": "v1alpha1", "machine": {"files": [{"content": "\nx", "path": "/var/f"}]}}
    assert decoded.normalize(files)["machine"]["files"][0]["content"] == "\nx"
