"""Wire compatibility of ichord's Talos bindings with an independently generated binding of the real
Talos protos (PyPI ``talos-linux-api-v1.6.0``, betterproto). Every message ichord uses is filled with
non-default values, encoded by ours and decoded by theirs, then encoded by theirs and decoded by ours:
the values must survive both ways, field numbers and wire types must agree."""

from __future__ import annotations

import datetime as dt
import importlib
from typing import Any

import pytest
from google.protobuf import descriptor as d
from google.protobuf.message import Message

from ichord.talos.proto.gen.common import common_pb2
from ichord.talos.proto.gen.machine import machine_pb2
from ichord.talos.proto.gen.resource.config import config_pb2
from ichord.talos.proto.gen.talos.definitions import k8s_pb2, runtime_pb2, secrets_pb2, v1alpha1_pb2

pytestmark = pytest.mark.integration

try:
    import betterproto

    THEIRS = "talos_linux_api.v1_6_0"
    importlib.import_module(f"{THEIRS}.machine")
except ImportError as exc:  # pragma: no cover - depends on the environment
    pytest.skip(f"talos-linux-api-v1-6-0 is not installed ({exc}); pip install talos-linux-api-v1-6-0",
                allow_module_level=True)

_MACHINE = [
    "ApplyConfigurationRequest", "ApplyConfiguration", "ApplyConfigurationResponse", "RebootRequest", "Reboot",
    "RebootResponse", "Version", "VersionInfo", "PlatformInfo", "FeaturesInfo", "VersionResponse",
    "EtcdMemberListRequest", "EtcdMember", "EtcdMembers", "EtcdMemberListResponse", "EtcdForfeitLeadershipRequest",
    "EtcdForfeitLeadership", "EtcdForfeitLeadershipResponse", "EtcdMemberAlarm", "EtcdAlarm",
    "EtcdAlarmListResponse", "EtcdMemberStatus", "EtcdStatus", "EtcdStatusResponse", "ServiceEvent",
    "ServiceEvents", "ServiceHealth", "ServiceInfo", "ServiceList", "ServiceListResponse", "ServiceRestartRequest",
    "ServiceRestart", "ServiceRestartResponse", "ReadRequest",
]
#: ours -> betterproto's class name (it camel-cases acronyms). PEMEncodedCertificate is newer than v1.6.
_COMMON = {"Metadata": "Metadata", "Data": "Data", "DataResponse": "DataResponse", "Empty": "Empty",
           "EmptyResponse": "EmptyResponse", "PEMEncodedCertificateAndKey": "PemEncodedCertificateAndKey",
           "PEMEncodedKey": "PemEncodedKey", "NetIP": "NetIp", "URL": "Url"}
PAIRS: list[tuple[type[Message], str]] = [
    *[(getattr(machine_pb2, n), f"machine.{n}") for n in _MACHINE],
    *[(getattr(common_pb2, n), f"common.{t}") for n, t in _COMMON.items()],
    (config_pb2.MachineConfigSpec, "resource.config.MachineConfigSpec"),
    (secrets_pb2.EtcdRootSpec, "talos.resource.definitions.secrets.EtcdRootSpec"),
    (secrets_pb2.EtcdCertsSpec, "talos.resource.definitions.secrets.EtcdCertsSpec"),
    (secrets_pb2.OSRootSpec, "talos.resource.definitions.secrets.OsRootSpec"),
    (secrets_pb2.KubernetesRootSpec, "talos.resource.definitions.secrets.KubernetesRootSpec"),
    (runtime_pb2.MachineStatusSpec, "talos.resource.definitions.runtime.MachineStatusSpec"),
    (runtime_pb2.MachineStatusStatus, "talos.resource.definitions.runtime.MachineStatusStatus"),
    (runtime_pb2.UnmetCondition, "talos.resource.definitions.runtime.UnmetCondition"),
    (k8s_pb2.NodenameSpec, "talos.resource.definitions.k8s.NodenameSpec"),
    (k8s_pb2.StaticPodStatusSpec, "talos.resource.definitions.k8s.StaticPodStatusSpec"),
    (v1alpha1_pb2.ServiceSpec, "talos.resource.definitions.v1alpha1.ServiceSpec"),
]
#: Fields ours has and v1.6 does not: added to Talos after v1.6.
NEWER_FIELDS = {("OSRootSpec", 5), ("KubernetesRootSpec", 15), ("KubernetesRootSpec", 17), ("EtcdMemberStatus", 11)}
#: Renamed since v1.6, same number and type.
RENAMED = {("OSRootSpec", 1): "ca", ("KubernetesRootSpec", 7): "ca"}


def theirs(path: str) -> type[Any]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(f"{THEIRS}.{module}"), name)  # type: ignore[no-any-return]


def fill(msg: Message, depth: int = 0) -> Message:
    """Every field set to a distinctive non-default value (two items for repeated fields)."""
    for f in msg.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.full_name == "google.rpc.Status":
            getattr(msg, f.name).code, getattr(msg, f.name).message = 5, "status-message"
            continue
        values = [_value(msg, f, i, depth) for i in range(2 if _repeated(f) else 1)]
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            getattr(msg, f.name).update({"k1": "v1", "k2": "v2"})
        elif _repeated(f):
            if f.message_type is not None:
                for v in values:
                    getattr(msg, f.name).add().CopyFrom(v)
            else:
                getattr(msg, f.name).extend(values)
        elif f.message_type is not None:
            getattr(msg, f.name).CopyFrom(values[0])
        else:
            setattr(msg, f.name, values[0])
    return msg


def _repeated(f: d.FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def _value(msg: Message, f: d.FieldDescriptor, i: int, depth: int) -> Any:
    t = d.FieldDescriptor
    if f.message_type is not None:
        cls = type(getattr(msg, f.name).add() if _repeated(f) else getattr(msg, f.name))
        if _repeated(f):
            del getattr(msg, f.name)[-1]
        sub = cls()
        name = f.message_type.full_name
        if name == "google.protobuf.Timestamp":
            sub.FromDatetime(dt.datetime(2026, 11, 29, 12, 0, i, tzinfo=dt.UTC))
        elif name == "google.protobuf.Duration":
            sub.FromTimedelta(dt.timedelta(seconds=90 + i))
        elif name == "google.protobuf.Struct":
            sub.update({"phase": "Running", "n": 3})
        elif depth < 4:
            fill(sub, depth + 1)
        return sub
    if f.enum_type is not None:
        return f.enum_type.values[-1].number
    if f.type == t.TYPE_STRING:
        return f"{f.name}-{i}"
    if f.type == t.TYPE_BYTES:
        return f"{f.name}-{i}".encode() + b"\x00\xff"
    if f.type == t.TYPE_BOOL:
        return True
    return 7 + f.number * 1000 + i


def _same(ours: Any, their: Any, where: str) -> None:
    if isinstance(ours, Message):
        name = ours.DESCRIPTOR.full_name
        if name == "google.protobuf.Timestamp":
            assert ours.ToDatetime(tzinfo=dt.UTC) == their, where
        elif name == "google.protobuf.Duration":
            assert ours.ToTimedelta() == their, where
        elif name == "google.protobuf.Struct":
            assert type(ours).FromString(bytes(their)) == ours, where
        else:
            compare(ours, their, where)
    elif hasattr(ours, "keys"):
        assert dict(ours) == dict(their), where
    elif isinstance(ours, list | tuple) or (hasattr(ours, "__len__") and not isinstance(ours, str | bytes)):
        assert len(ours) == len(their), where
        for i, (a, b) in enumerate(zip(ours, their, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert ours == their, f"{where}: {ours!r} != {their!r}"


def compare(ours: Message, their: Any, where: str) -> None:
    their_fields = {m.number: name for name, m in their._betterproto.meta_by_field_name.items()}
    short = ours.DESCRIPTOR.name
    for f in ours.DESCRIPTOR.fields:
        if f.number not in their_fields:
            assert (short, f.number) in NEWER_FIELDS, f"{where}.{f.name} (#{f.number}) unknown to Talos v1.6"
            continue
        their_name = their_fields[f.number]
        assert their_name == RENAMED.get((short, f.number), f.name), f"{where}: #{f.number} is {their_name}"
        if f.message_type is not None and f.message_type.full_name == "google.rpc.Status":
            status = getattr(their, their_name)
            assert (status.code, status.message) == (5, "status-message"), where
            continue
        ours_value = getattr(ours, f.name)
        their_value = getattr(their, their_name)
        if f.enum_type is not None and not _repeated(f):
            assert int(their_value) == ours_value, f"{where}.{f.name}"
        else:
            _same(ours_value if not (f.message_type and f.message_type.GetOptions().map_entry) else dict(ours_value),
                  their_value, f"{where}.{f.name}")


@pytest.mark.parametrize(("ours_cls", "their_path"), PAIRS, ids=[p[1] for p in PAIRS])
def test_encoded_by_one_decodes_identically_with_the_other(ours_cls: type[Message], their_path: str) -> None:
    ours = fill(ours_cls())
    data = ours.SerializeToString(deterministic=True)
    assert data or not ours.DESCRIPTOR.fields
    their = theirs(their_path)().parse(data)
    compare(ours, their, ours.DESCRIPTOR.full_name)  # ours -> theirs: every value decoded the same
    back = ours_cls.FromString(bytes(their))  # theirs -> ours: encoded by betterproto, decoded by protobuf
    assert back == ours
    assert isinstance(their, betterproto.Message)


def test_every_rpc_of_ours_exists_in_talos() -> None:
    stub = theirs("machine.MachineServiceStub")
    rpcs = machine_pb2.DESCRIPTOR.services_by_name["MachineService"].methods
    assert len(rpcs) == 11
    for rpc in rpcs:
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in rpc.name).lstrip("_")
        assert hasattr(stub, snake), rpc.name
