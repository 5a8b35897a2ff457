"""The snapshot file (ichord/etcd_snapshot/file.py): whole or absent, never over a file, checked as etcd's."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest

from ichord.etcd_snapshot.file import (
    AtomicSnapshot,
    SnapshotDestinationError,
    SnapshotIntegrityError,
    SnapshotWriteError,
    check_destination,
    describe,
)
from ichord.sim.talos import etcd_db


def _snapshot() -> bytes:
    return etcd_db.snapshot([etcd_db.Member("cp-1", 1, "https://a:2380", "https://a:2379")],
                            [etcd_db.Put(b"/registry/x", b"v", 2)], term=1, consistent_index=2)


def _write(path: Path, data: bytes, chunk: int = 1000) -> AtomicSnapshot:
    out = AtomicSnapshot(path)
    for i in range(0, len(data), chunk):
        out.write(data[i:i + chunk])
    return out


def test_written_whole_with_etcds_trailer_checked(tmp_path: Path) -> None:
    data = _snapshot()
    with _write(tmp_path / "s.db", data) as out:
        result = out.commit()
    assert (tmp_path / "s.db").read_bytes() == data and os.listdir(tmp_path) == ["s.db"]
    assert stat.S_IMODE((tmp_path / "s.db").stat().st_mode) == 0o600
    assert (result.size, result.sha256, result.trailer_verified) == (len(data), hashlib.sha256(data).hexdigest(), True)
    assert describe(tmp_path / "s.db") == result


def test_a_database_without_etcds_trailer_is_kept_and_says_so(tmp_path: Path) -> None:
    data = _snapshot()[:-32]
    with _write(tmp_path / "s.db", data) as out:
        assert out.commit().trailer_verified is False


@pytest.mark.parametrize("damage", ["not-bolt", "trailer"])
def test_a_damaged_stream_leaves_nothing(tmp_path: Path, damage: str) -> None:
    data = _snapshot()
    data = b"x" * len(data) if damage == "not-bolt" else data[:100] + b"\xff" + data[101:]
    with pytest.raises(SnapshotIntegrityError), _write(tmp_path / "s.db", data) as out:
        out.commit()
    assert os.listdir(tmp_path) == []


def test_never_over_a_file_even_one_that_appears_meanwhile(tmp_path: Path) -> None:
    (tmp_path / "old.db").write_bytes(b"keep")
    with pytest.raises(SnapshotDestinationError, match="exists"):
        check_destination(tmp_path / "old.db")
    with _write(tmp_path / "s.db", _snapshot()) as out:
        (tmp_path / "s.db").write_bytes(b"someone else's")
        with pytest.raises(SnapshotDestinationError, match="appeared while"):
            out.commit()
    assert (tmp_path / "s.db").read_bytes() == b"someone else's" and sorted(os.listdir(tmp_path)) == ["old.db", "s.db"]


def test_a_failed_local_write_is_its_own_error_and_leaves_nothing(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def full(_fd: int, _data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with AtomicSnapshot(tmp_path / "s.db") as out:
        monkeypatch.setattr(os, "write", full)
        with pytest.raises(SnapshotWriteError, match="No space left on device"):
            out.write(b"abc")
    assert os.listdir(tmp_path) == []
