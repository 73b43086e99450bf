"""Conversions between the wire's objects and the library's dataclasses.

The daemon sends the library's values as they are (a frozen dataclass
encodes as the map of its fields, in order, exactly as its wire twin in
``walqueue.protocol.messages``); a client decodes the twin, which checks
every field, and turns it back into the library's value here. The daemon's
report, ``DaemonStats``, is the exception: it is sent through its twin so
that the fields a peer's version lacks can be left out
(`daemon_stats_to_wire`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import msgspec

from walqueue import InvalidRequest, Lease, QueueStats, TaskView
from walqueue.protocol.messages import (
    CLOCK_REPORTING_VERSION,
    COMPACTION_REPORTING_VERSION,
    EXPIRY_REPORTING_VERSION,
    TURN_REPORTING_VERSION,
    VERSION_REPORTING_VERSION,
    BackupFile,
    DaemonStats,
    Manifest,
    PutItem,
    WireDaemonStats,
    WireLease,
    WireStats,
    WireTask,
)
from walqueue.values import BackupManifest

__all__ = [
    "daemon_stats_from_wire", "daemon_stats_to_wire", "lease_from_wire", "manifest_from_wire",
    "manifest_to_wire", "put_item", "stats_from_wire", "task_from_wire",
]


def _from_wire(wire: msgspec.Struct, value_type: type) -> Any:
    """The library value a wire twin stands for (the daemon sends the values themselves)."""
    return value_type(*[getattr(wire, name) for name in wire.__struct_fields__])


def lease_from_wire(wire: WireLease) -> Lease:
    # Spelled out: the hot conversion of every reserve's answer.
    return Lease(wire.task_id, wire.worker, wire.generation, wire.deadline, wire.attempts, wire.payload)


def task_from_wire(wire: WireTask) -> TaskView:
    return _from_wire(wire, TaskView)


def stats_from_wire(wire: WireStats) -> QueueStats:
    return _from_wire(wire, QueueStats)


def manifest_to_wire(request_id: int, manifest: BackupManifest) -> Manifest:
    files = [BackupFile(name, length) for name, length in manifest.files]
    return Manifest(id=request_id, directory=manifest.directory, seq=manifest.seq, files=files)


def manifest_from_wire(wire: Manifest) -> BackupManifest:
    files = tuple((item.name, item.length) for item in wire.files)
    return BackupManifest(directory=wire.directory, seq=wire.seq, files=files)


def _since_version(name: str) -> int:
    """The protocol version that added DaemonStats field ``name`` (1 for the original ones)."""
    names = [field.name for field in dataclasses.fields(DaemonStats)]
    if names.index(name) >= names.index("expired_total"):
        return EXPIRY_REPORTING_VERSION
    if names.index(name) >= names.index("slow_turns_total"):
        return TURN_REPORTING_VERSION
    if names.index(name) >= names.index("compact_wal_ratio"):
        return COMPACTION_REPORTING_VERSION
    if names.index(name) >= names.index("clock_steps_total"):
        return CLOCK_REPORTING_VERSION
    return VERSION_REPORTING_VERSION if name == "version" else 1


_DAEMON_STATS_DEFAULTS = {field.name: (field.default, _since_version(field.name))
                          for field in dataclasses.fields(DaemonStats)
                          if field.default is not dataclasses.MISSING}


def daemon_stats_to_wire(stats: DaemonStats, protocol_version: int) -> WireDaemonStats:
    """The report as a peer speaking ``protocol_version`` may read it: the fields a later
    version added are set to their defaults, which the wire omits."""
    fields = {name: getattr(stats, name) for name in WireDaemonStats.__struct_fields__}
    for name, (default, since) in _DAEMON_STATS_DEFAULTS.items():
        if protocol_version < since:
            fields[name] = default
    return WireDaemonStats(**fields)


def daemon_stats_from_wire(wire: WireDaemonStats) -> DaemonStats:
    return dataclasses.replace(_from_wire(wire, DaemonStats), queue=stats_from_wire(wire.queue))


def put_item(request: Any) -> PutItem:
    """Convert a ``PutRequest`` or a mapping with its field names. Raises InvalidRequest."""
    if isinstance(request, Mapping):
        unknown = set(request) - set(PutItem.__struct_fields__)
        if unknown:
            raise InvalidRequest(f"unknown put_many field(s) {sorted(map(str, unknown))}")
        if "task_id" not in request or "payload" not in request:
            raise InvalidRequest("a put_many request needs task_id and payload")
        fields = dict(request)
    else:
        try:
            fields = {name: getattr(request, name) for name in PutItem.__struct_fields__}
        except AttributeError as exc:
            raise InvalidRequest(
                f"put_many takes PutRequest objects or mappings, got {type(request).__name__}"
            ) from exc
    return PutItem(**fields)
