"""GaugeSeries: the per-cluster gauges as one dict, exported under each of their names."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from ichord.metrics import GaugeSeries


def test_a_series_is_exported_under_every_name_and_removed_from_all() -> None:
    registry = CollectorRegistry(auto_describe=True)
    series = GaugeSeries(("new_name", "old_name"), ("the value", "deprecated: new_name"), ["cluster", "ca"],
                         registry=registry)
    series.set(("ns/a", "etcd"), 5.0)
    series.set(("ns/b", "etcd"), 7.0)
    series.set(("ns/a", "etcd"), 6.0)  # set again: one series, the latest value
    for name in ("new_name", "old_name"):
        assert registry.get_sample_value(name, {"cluster": "ns/a", "ca": "etcd"}) == 6.0
        assert registry.get_sample_value(name, {"cluster": "ns/b", "ca": "etcd"}) == 7.0
    text = generate_latest(registry).decode()
    assert "# TYPE new_name gauge" in text and "# HELP old_name deprecated: new_name" in text
    series.remove(("ns/a", "etcd"))
    series.remove(("ns/never", "etcd"))  # never set: no error
    for name in ("new_name", "old_name"):
        assert registry.get_sample_value(name, {"cluster": "ns/a", "ca": "etcd"}) is None
        assert registry.get_sample_value(name, {"cluster": "ns/b", "ca": "etcd"}) == 7.0
