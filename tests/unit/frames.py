"""Helpers that build WALQueue's on-disk bytes straight from SPEC §4.

Nothing here imports the library: the expected bytes come from the contract,
so a test comparing them with what the library wrote checks the library
against the SPEC, not against itself.
"""

import hashlib
import json
import re
import struct
from pathlib import Path

MAX_FRAME_BYTES = 16 * 1024 * 1024
DIGEST_BYTES = 32
LENGTH_BYTES = 4


def canonical(value) -> bytes:
    """SPEC §4's canonical JSON, exactly."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def frame_body(body: bytes) -> bytes:
    """Wrap raw JSON bytes (canonical or not) in a frame with a valid digest."""
    return struct.pack(">I", len(body)) + body + hashlib.sha256(body).digest()


def frame(value) -> bytes:
    """A frame holding the canonical JSON of value."""
    return frame_body(canonical(value))


def frames(*values) -> bytes:
    return b"".join(frame(value) for value in values)


def identity(task_id, payload, available_at=0, max_attempts=3) -> str:
    return hashlib.sha256(
        canonical(
            {
                "available_at": available_at,
                "max_attempts": max_attempts,
                "payload": payload,
                "task_id": task_id,
            }
        )
    ).hexdigest()


# -- file names -------------------------------------------------------------


def wal_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.snap"


# -- WAL records ------------------------------------------------------------


def put_task(task_id, payload, key=None, available_at=0, max_attempts=3) -> dict:
    return {
        "available_at": available_at,
        "key": task_id if key is None else key,
        "max_attempts": max_attempts,
        "payload": payload,
        "task_id": task_id,
    }


def put_record(seq, *tasks) -> dict:
    return {"op": "put", "seq": seq, "tasks": list(tasks)}


def expire_record(seq, now, task_ids) -> dict:
    return {"now": now, "op": "expire", "seq": seq, "task_ids": list(task_ids)}


def reserve_record(seq, now, worker, lease_seconds, task_ids) -> dict:
    return {
        "lease_seconds": lease_seconds,
        "now": now,
        "op": "reserve",
        "seq": seq,
        "task_ids": list(task_ids),
        "worker": worker,
    }


def ack_record(seq, now, task_id, worker, generation) -> dict:
    return {
        "generation": generation,
        "now": now,
        "op": "ack",
        "seq": seq,
        "task_id": task_id,
        "worker": worker,
    }


def release_record(seq, now, task_id, worker, generation, delay=0) -> dict:
    return {
        "delay": delay,
        "generation": generation,
        "now": now,
        "op": "release",
        "seq": seq,
        "task_id": task_id,
        "worker": worker,
    }


def touch_record(seq, now, task_id, worker, generation, lease_seconds) -> dict:
    return {
        "generation": generation,
        "lease_seconds": lease_seconds,
        "now": now,
        "op": "touch",
        "seq": seq,
        "task_id": task_id,
        "worker": worker,
    }


def revive_record(seq, now, task_ids) -> dict:
    return {"now": now, "op": "revive", "seq": seq, "task_ids": list(task_ids)}


# -- snapshots and CURRENT --------------------------------------------------


def snapshot_entry(
    task_id,
    payload,
    *,
    key=None,
    status="ready",
    attempts=0,
    max_attempts=3,
    generation=0,
    available_at=0,
    deadline=None,
    worker=None,
    original_available_at=None,
    identity_payload=None,
) -> dict:
    """One snapshot entry. The identity is computed from the ORIGINAL request
    (original_available_at, identity_payload default to the current values)."""
    if original_available_at is None:
        original_available_at = available_at
    if identity_payload is None:
        identity_payload = payload
    return {
        "attempts": attempts,
        "available_at": available_at,
        "deadline": deadline,
        "generation": generation,
        "identity": identity(task_id, identity_payload, original_available_at, max_attempts),
        "key": task_id if key is None else key,
        "max_attempts": max_attempts,
        "payload": payload,
        "status": status,
        "task_id": task_id,
        "worker": worker,
    }


def snapshot_header(seq, task_count) -> dict:
    return {"format": 1, "kind": "walqueue.snapshot", "seq": seq, "task_count": task_count}


def snapshot_end(task_count) -> dict:
    return {"kind": "end", "task_count": task_count}


def snapshot_bytes(seq, entries) -> bytes:
    entries = list(entries)
    return frames(snapshot_header(seq, len(entries)), *entries, snapshot_end(len(entries)))


def current_record(seq) -> dict:
    return {"format": 1, "seq": seq, "snapshot": snapshot_name(seq)}


def current_bytes(seq) -> bytes:
    return frame(current_record(seq))


# -- reading a directory ----------------------------------------------------


def read_dir(directory) -> dict[str, bytes]:
    """Every regular file's name and bytes: compare before and after a call to
    prove that it wrote nothing."""
    return {
        path.name: path.read_bytes() for path in sorted(Path(directory).iterdir()) if path.is_file()
    }


def parse_frames(data: bytes) -> list:
    """Decode a run of complete, valid frames (test-side reader; asserts)."""
    values = []
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack_from(">I", data, offset)
        body = data[offset + 4 : offset + 4 + length]
        digest = data[offset + 4 + length : offset + 4 + length + DIGEST_BYTES]
        assert len(body) == length and hashlib.sha256(body).digest() == digest
        value = json.loads(body)
        assert canonical(value) == body
        values.append(value)
        offset += 4 + length + DIGEST_BYTES
    return values


def wal_records(directory) -> list[dict]:
    """Every record in every WAL segment of directory, in segment order."""
    records = []
    for path in sorted(Path(directory).glob("wal-*.log")):
        records.extend(parse_frames(path.read_bytes()))
    return records


def wal_bytes_on_disk(directory) -> int:
    return sum(path.stat().st_size for path in Path(directory).glob("wal-*.log"))


def wal_segment_names(directory) -> list[str]:
    return sorted(path.name for path in Path(directory).glob("wal-*.log"))


def names_number(message: str, number: int) -> bool:
    """True when message mentions number as a whole number (not as part of
    a longer run of digits)."""
    return re.search(rf"(?<!\d){number}(?!\d)", message) is not None
