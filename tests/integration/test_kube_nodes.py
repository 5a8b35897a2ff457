"""Cordon and uncordon (ichord/kube/nodes.py) on the Kubernetes API simulator: one merge patch with the
read resourceVersion, the cordoned-by-ichor annotation, and a person's cordon left alone."""

from __future__ import annotations

from typing import Any

import pytest

from ichord.kube.client import KubeClient
from ichord.kube.errors import Conflict
from ichord.kube.nodes import CORDONED_BY_ICHORD_ANNOTATION, MERGE_PATCH, _patch, cordon, read_node_view, uncordon

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def make_node(kube: KubeClient, name: str, **spec: Any) -> None:
    await kube.raw("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                                  "spec": spec})


async def test_cordon_marks_the_node_as_ichords_and_uncordon_undoes_exactly_that(kube: KubeClient) -> None:
    await make_node(kube, "n1")
    view = await cordon(kube, "n1")
    assert view.unschedulable and view.cordoned_by_ichord
    raw = await kube.raw("GET", "/api/v1/nodes/n1")
    assert raw["spec"]["unschedulable"] is True
    assert raw["metadata"]["annotations"][CORDONED_BY_ICHORD_ANNOTATION] == "true"
    assert (await cordon(kube, "n1")).resource_version == view.resource_version  # already cordoned: nothing sent
    assert await uncordon(kube, "n1")
    raw = await kube.raw("GET", "/api/v1/nodes/n1")
    assert not raw["spec"].get("unschedulable")
    assert CORDONED_BY_ICHORD_ANNOTATION not in (raw["metadata"].get("annotations") or {})
    assert not await uncordon(kube, "n1")  # nothing of ichord's left to undo


async def test_a_node_a_person_cordoned_is_neither_annotated_nor_uncordoned(kube: KubeClient) -> None:
    await make_node(kube, "n2", unschedulable=True)
    view = await cordon(kube, "n2")
    assert view.unschedulable and not view.cordoned_by_ichord
    assert not await uncordon(kube, "n2")
    assert (await read_node_view(kube, "n2")).unschedulable


async def test_a_patch_on_a_stale_read_is_refused_not_applied(kube: KubeClient) -> None:
    await make_node(kube, "n3")
    stale = await read_node_view(kube, "n3")
    await kube.raw("PATCH", "/api/v1/nodes/n3", body={"metadata": {"labels": {"edited": "by-someone"}}},
                   content_type=MERGE_PATCH)
    with pytest.raises(Conflict):
        await _patch(kube, "n3", {"metadata": {"resourceVersion": stale.resource_version},
                                  "spec": {"unschedulable": True}})
    assert not (await read_node_view(kube, "n3")).unschedulable


async def test_a_cordon_on_the_steps_copy_reads_again_once_when_someone_wrote_the_node_since(kube: KubeClient) -> None:
    await make_node(kube, "n4")
    copy = await read_node_view(kube, "n4")
    await kube.raw("PATCH", "/api/v1/nodes/n4", body={"metadata": {"labels": {"edited": "by-someone"}}},
                   content_type=MERGE_PATCH)
    view = await cordon(kube, "n4", copy)  # 409 on the copy: read again, decided again, cordoned
    assert view.unschedulable and view.cordoned_by_ichord
    raw = await kube.raw("GET", "/api/v1/nodes/n4")
    assert raw["metadata"]["labels"]["edited"] == "by-someone"  # their write kept, not overwritten
    await kube.raw("PATCH", "/api/v1/nodes/n4", body={"metadata": {"labels": {"edited": "again"}}},
                   content_type=MERGE_PATCH)
    assert await uncordon(kube, "n4", view)  # 409 on the copy again: read again, still ichord's cordon, undone
    assert not (await read_node_view(kube, "n4")).unschedulable


async def test_a_person_who_cordoned_since_the_copy_was_read_keeps_their_cordon(kube: KubeClient) -> None:
    await make_node(kube, "n5")
    copy = await read_node_view(kube, "n5")
    await kube.raw("PATCH", "/api/v1/nodes/n5", body={"spec": {"unschedulable": True}}, content_type=MERGE_PATCH)
    view = await cordon(kube, "n5", copy)  # decided again on the Node as it is now: a person's cordon, left alone
    assert view.unschedulable and not view.cordoned_by_ichord
    mine = await cordon(kube, "n5")
    assert not await uncordon(kube, "n5", copy)  # the copy says not ichord's: nothing sent
    assert (await read_node_view(kube, "n5")).unschedulable and not mine.cordoned_by_ichord
