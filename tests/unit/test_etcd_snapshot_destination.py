"""The TalosCluster's spec.etcdSnapshots as ichord reads it: a retention above the CRD's maximum, stored before the
CRD had one, holds the snapshot (and so the operation's first reboot) with a message naming the field."""

from __future__ import annotations

from pathlib import Path

from ichord.operations.etcd_snapshot import MAX_RETAIN, Destination


def test_a_retention_above_the_maximum_is_a_problem_named_by_its_field(tmp_path: Path) -> None:
    too_many = Destination.of({"etcdSnapshots": {"path": str(tmp_path), "retain": 99999999999}})
    assert too_many is not None
    assert too_many.problem() == ("spec.etcdSnapshots.retain 99999999999 is above 1000, the most snapshots of a "
                                  "cluster ichord keeps: lower it")
    most = Destination.of({"etcdSnapshots": {"path": str(tmp_path), "retain": MAX_RETAIN}})
    assert most is not None and most.problem() is None
