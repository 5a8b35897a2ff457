"""The chart mounts the etcd snapshot volume (values etcdSnapshots) only when one is given."""

from __future__ import annotations

import pytest

from tests._helm import find_helm, render

pytestmark = pytest.mark.skipif(find_helm() is None, reason="helm is not installed (PATH, $ICHORD_HELM or the "
                                                            "tools build): the chart is not rendered")


def _deployment(*args: str) -> dict[str, object]:
    return next(d for d in render(*args) if d["kind"] == "Deployment")


def test_a_snapshot_volume_is_mounted_where_the_values_say() -> None:
    spec = _deployment("--set", "etcdSnapshots.volume.persistentVolumeClaim.claimName=snaps",
                       "--set", "etcdSnapshots.mountPath=/backups")["spec"]["template"]["spec"]  # type: ignore[index]
    (container,) = spec["containers"]
    assert {"name": "etcd-snapshots", "mountPath": "/backups"} in container["volumeMounts"]
    assert {"name": "etcd-snapshots", "persistentVolumeClaim": {"claimName": "snaps"}} in spec["volumes"]


def test_no_volume_no_mount() -> None:
    spec = _deployment()["spec"]["template"]["spec"]  # type: ignore[index]
    assert all(v["name"] != "etcd-snapshots" for v in spec["volumes"])
