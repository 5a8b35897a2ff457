"""What Talos's decoder changes in a value as it reads it, done to a patched document the same way.

A node decodes the configuration ichord sends, and the configuration it then holds (and serves back) is the
decoded one; ``talosctl gen config`` with the same patches writes the decoded values too. Where a type's own
unmarshaler rewrites a value, ichord rewrites it alike, so the rendered configuration is what Talos holds
(tests/real/test_strict_lists_oracle.py compares the two):

    cluster.inlineManifests[].contents   v1alpha1.ClusterInlineManifests trims leading tabs, newlines,
                                         vertical tabs, form feeds and carriage returns (not spaces)
"""

from __future__ import annotations

from typing import Any, TypeVar

from ruamel.yaml.scalarstring import FoldedScalarString, LiteralScalarString

from ichord.render.config import V1ALPHA1

#: The characters ClusterInlineManifests.UnmarshalYAML trims from the start of a manifest's contents.
_INLINE_TRIM = "\t\n\v\f\r"

Doc = TypeVar("Doc", bound=dict[str, Any])


def normalize(doc: Doc) -> Doc:
    """``doc`` (changed in place) with the values Talos's decoder rewrites written as it writes them."""
    if "kind" in doc or doc.get("version") != V1ALPHA1:
        return doc
    cluster = doc.get("cluster")
    manifests = cluster.get("inlineManifests") if isinstance(cluster, dict) else None
    for manifest in manifests if isinstance(manifests, list) else ():
        contents = manifest.get("contents") if isinstance(manifest, dict) else None
        if isinstance(contents, str) and contents[:1] in tuple(_INLINE_TRIM):
            trimmed = contents.lstrip(_INLINE_TRIM)
            # A block scalar keeps its style (a literal stays a literal block, as Talos writes multi-line text).
            manifest["contents"] = type(contents)(trimmed) if isinstance(
                contents, LiteralScalarString | FoldedScalarString) else trimmed
    return doc
