"""An independent reader of the SPEC §3/§4 directory layout, for tests only.

What it proves: when the stateful test compares these readings with the
reference model, that the bytes the library leaves on disk are the records,
snapshot and CURRENT pointer SPEC §4 describes — not merely that the library
can read back its own files. It never writes and imports nothing from walqueue.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.model.reference import MAX_FRAME_BYTES, canonical_json


class FrameError(AssertionError):
    """The bytes are not what SPEC §4 says; the message names file and offset."""


@dataclass(frozen=True)
class Frame:
    offset: int
    value: Any


def read_frames(path: Path) -> list[Frame]:
    """The complete frames of `path`; stops at an incomplete or all-zero tail."""
    data = path.read_bytes()
    frames: list[Frame] = []
    offset = 0
    while offset < len(data):
        if not any(data[offset:]):
            break  # a zero tail (preallocation) holds no frame
        if len(data) - offset < 4:
            break
        length = int.from_bytes(data[offset : offset + 4], "big")
        if not 1 <= length <= MAX_FRAME_BYTES:
            raise FrameError(f"{path.name}@{offset}: length {length} out of bounds")
        end = offset + 4 + length + 32
        if end > len(data):
            break
        body = data[offset + 4 : offset + 4 + length]
        if hashlib.sha256(body).digest() != data[offset + 4 + length : end]:
            raise FrameError(f"{path.name}@{offset}: digest mismatch")
        value = json.loads(body)
        if canonical_json(value) != body:
            raise FrameError(f"{path.name}@{offset}: JSON is not canonical: {body[:200]!r}")
        frames.append(Frame(offset, value))
        offset = end
    return frames


def segment_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("wal-*.log"))


def wal_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of every segment, in order, checking segment names."""
    records: list[dict[str, Any]] = []
    for path in segment_paths(directory):
        frames = read_frames(path)
        first_seq = int(path.name[len("wal-") : -len(".log")])
        if frames and frames[0].value.get("seq") != first_seq:
            raise FrameError(f"{path.name}: first frame has seq {frames[0].value.get('seq')}")
        records.extend(frame.value for frame in frames)
    return records


def read_current(directory: Path) -> dict[str, Any] | None:
    path = directory / "CURRENT"
    if not path.exists():
        return None
    frames = read_frames(path)
    if len(frames) != 1 or path.stat().st_size != frames[0].offset + 4 + 32 + len(
        canonical_json(frames[0].value)
    ):
        raise FrameError("CURRENT is not exactly one frame")
    return frames[0].value


@dataclass(frozen=True)
class Snapshot:
    header: dict[str, Any]
    entries: list[dict[str, Any]]
    end: dict[str, Any]


def read_snapshot(path: Path) -> Snapshot:
    frames = read_frames(path)
    if len(frames) < 2:
        raise FrameError(f"{path.name}: fewer than two frames")
    size = frames[-1].offset + 4 + len(canonical_json(frames[-1].value)) + 32
    if size != path.stat().st_size:
        raise FrameError(f"{path.name}: bytes after the end frame")
    return Snapshot(frames[0].value, [f.value for f in frames[1:-1]], frames[-1].value)


def frame_size(record: dict[str, Any]) -> int:
    return 4 + len(canonical_json(record)) + 32
