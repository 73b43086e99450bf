"""Deliberately broken variants of walqueue._speedups, each one plausible slip in the C.

The differential check (tests/speedups_cases.py) compares the extension with
the pure reference; tests/unit/test_speedups.py requires it to find each of
these, and nothing on the real extension. A variant is the real module
wrapped, with one function changed in Python to behave as the slip would:
swapped in for `walqueue.speedups.speedups` for the length of a test
(`installed(name)`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from unittest import mock

from walqueue import speedups

_LENGTH, _DIGEST = 4, 32


class _Wrapped:
    """The real extension: every name not overridden is the real one."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


class AcceptsBadDigest(_Wrapped):
    """The frame walk forgets to compare the digest: a frame whose SHA-256 fails, but whose body
    is good canonical JSON, is returned as a frame (the reference raises CorruptStore)."""

    def scan(self, data, offset, stop_at_entry, max_frames, frame_type):
        frames, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames, frame_type)
        while code == self.SCAN_DEFER and len(frames) < max_frames:
            frame = _bad_digest_frame(data, offset, frame_type)
            if frame is None:
                break
            frames.append(frame)
            offset = frame[1]
            more, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames - len(frames),
                                                 frame_type)
            frames += more
        return frames, offset, code


def _bad_digest_frame(data, offset: int, frame_type):
    """The frame at `offset` if only its digest is wrong (length in bounds, body canonical)."""
    if len(data) - offset < _LENGTH + _DIGEST:
        return None
    length = int.from_bytes(data[offset:offset + _LENGTH], "big")
    end = offset + _LENGTH + length + _DIGEST
    if length == 0 or end > len(data):
        return None
    body = bytes(data[offset + _LENGTH:end - _DIGEST])
    if hashlib.sha256(body).digest() == bytes(data[end - _DIGEST:end]):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    canonical = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    if type(value) is not dict or canonical.encode() != body:
        return None
    return frame_type(offset, end, value)


class DefersPastTheFrame(_Wrapped):
    """The frame walk, handing a frame it cannot decide back, reports the offset after that
    frame's length field instead of the frame's start: the reference then reads (and names)
    the wrong place."""

    def scan(self, data, offset, stop_at_entry, max_frames, frame_type):
        frames, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames, frame_type)
        if code == self.SCAN_DEFER and offset + _LENGTH <= len(data):
            offset += _LENGTH
        return frames, offset, code


class IgnoresTaskIdOrder(_Wrapped):
    """The tombstone load forgets the task_id order rule (it is told no last id): an entry out
    of order after the first block is loaded (the reference says it is out of order)."""

    def load_tombstones(self, data, offset, limit, last_id, taken):
        return self._real.load_tombstones(data, offset, limit, b"", taken)


class DropsABlocksLastFrame(_Wrapped):
    """The snapshot writer encodes one tombstone too few per block (an off-by-one in the count)."""

    def tombstone_frames(self, names, name_bounds, values, value_bounds, identities, numbers,
                         order, count):
        return self._real.tombstone_frames(names, name_bounds, values, value_bounds, identities,
                                           numbers, order, max(count - 1, 1))


VARIANTS = {
    "accepts_bad_digest": AcceptsBadDigest,
    "defers_past_the_frame": DefersPastTheFrame,
    "ignores_task_id_order": IgnoresTaskIdOrder,
    "drops_a_blocks_last_frame": DropsABlocksLastFrame,
}


@contextlib.contextmanager
def installed(name: str) -> Iterator[None]:
    """The variant `name` as the extension every caller of walqueue.speedups uses."""
    assert speedups.COMPILED, "the broken variants wrap the compiled extension"
    with mock.patch.object(speedups, "speedups", VARIANTS[name](speedups.speedups)):
        yield
