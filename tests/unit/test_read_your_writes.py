"""ReadYourWrites: the newer of the informer's copy and this process's own last write, until the watch catches up."""

from __future__ import annotations

import json
from typing import Any

from ichord.watchers.informer import Informer, Resource
from ichord.watchers.written import ReadYourWrites

KEY = ("ns", "op")


def _op(rv: str, stage: str = "", uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "op", "uid": uid, "resourceVersion": rv},
            "status": {"stage": stage}}


def _event(informer: Informer, kind: str, obj: dict[str, Any]) -> None:
    informer._handle_line(json.dumps({"type": kind, "object": obj}).encode())  # the watch's own path


def _informer() -> Informer:
    return Informer(None, Resource("ichord.dev", "v1alpha1", "talosoperations"))  # type: ignore[arg-type]


def _stage(view: ReadYourWrites) -> str:
    obj = view.get(KEY)
    assert obj is not None
    return str(obj["status"]["stage"])


def test_a_write_is_read_back_until_the_watch_delivers_it_or_something_newer() -> None:
    informer = _informer()
    view = ReadYourWrites(informer)
    _event(informer, "ADDED", _op("10"))
    view.note(_op("12", "Rolling"))
    assert _stage(view) == "Rolling"  # the cache still holds 10
    _event(informer, "MODIFIED", _op("11", ""))  # someone else's write, before ours
    assert _stage(view) == "Rolling"
    _event(informer, "MODIFIED", _op("12", "Rolling"))  # ours arrives
    assert _stage(view) == "Rolling" and len(view) == 0  # the cache serves it; the copy is gone
    view.note(_op("12", "Rolling"))  # a late answer of a write the watch already delivered: not kept
    assert len(view) == 0


def test_a_bookmark_past_the_write_means_the_cache_is_the_truth() -> None:
    informer = _informer()
    view = ReadYourWrites(informer)
    _event(informer, "ADDED", _op("10"))
    view.note(_op("12", "Rolling"))
    _event(informer, "MODIFIED", _op("13", "Done"))  # ours and then another write: the cache is newer
    assert _stage(view) == "Done" and len(view) == 0
    view.note(_op("14", "Rolling"))
    informer._handle_line(json.dumps({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}).encode())
    assert _stage(view) == "Done"  # every event up to 20 delivered: whatever the cache holds is newer than 14


def test_a_deleted_object_leaves_no_copy_and_a_new_one_of_the_same_name_is_not_shadowed() -> None:
    informer = _informer()
    view = ReadYourWrites(informer)
    _event(informer, "ADDED", _op("10"))
    view.note(_op("12", "Rolling"))
    _event(informer, "DELETED", _op("13", "Rolling"))
    assert view.get(KEY) is None and len(view) == 0
    _event(informer, "ADDED", _op("14", "", uid="u2"))
    assert _stage(view) == ""


def test_versions_that_are_not_numbers_are_only_compared_for_equality() -> None:
    informer = _informer()
    view = ReadYourWrites(informer)
    _event(informer, "ADDED", _op("a"))
    view.note(_op("b", "Rolling"))
    _event(informer, "MODIFIED", _op("c", "Other"))  # cannot be ordered: our write still wins
    assert _stage(view) == "Rolling"
    _event(informer, "MODIFIED", _op("b", "Rolling"))
    assert _stage(view) == "Rolling" and len(view) == 0
