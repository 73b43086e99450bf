"""A damaged length in the newest segment is corruption, not a torn tail.

SPEC §5 treats a frame whose length runs past the end of the newest segment
as torn, and truncates it. A crash can only leave one partial frame at the
very end; when a complete frame with a good digest follows, the length was
damaged instead, and truncating would silently drop answered frames.
"""

from __future__ import annotations

import struct

import pytest

from walqueue import CorruptStore, Queue


def newest_segment(directory):
    return sorted(directory.glob("wal-*.log"))[-1]


def three_puts(directory) -> list[int]:
    """Three put frames; returns the offset of each."""
    queue = Queue(directory)
    offsets = []
    for index in range(3):
        offsets.append(queue.stats().wal_bytes)
        queue.put(f"t{index}", {"n": index})
    queue.close()
    return offsets


@pytest.mark.parametrize("damaged", [0, 1])
def test_a_length_damaged_to_run_past_the_end_with_frames_after_it_is_corrupt(tmp_path, damaged) -> None:
    offsets = three_puts(tmp_path)
    segment = newest_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[offsets[damaged]:offsets[damaged] + 4] = struct.pack(">I", len(data))
    segment.write_bytes(bytes(data))
    before = segment.read_bytes()
    with pytest.raises(CorruptStore, match=rf"offset {offsets[damaged]} .*complete frame follows"):
        Queue(tmp_path)
    assert segment.read_bytes() == before  # nothing truncated


def test_a_genuinely_torn_final_frame_is_still_truncated(tmp_path) -> None:
    offsets = three_puts(tmp_path)
    segment = newest_segment(tmp_path)
    data = segment.read_bytes()
    segment.write_bytes(data[:len(data) - 5])
    queue = Queue(tmp_path)
    assert queue.stats().last_seq == 2
    assert queue.stats().wal_bytes == offsets[2]
    queue.close()


def test_a_damaged_length_followed_only_by_zeros_is_a_torn_tail(tmp_path) -> None:
    three_puts(tmp_path)
    segment = newest_segment(tmp_path)
    data = segment.read_bytes()
    # A final frame whose length claims 16 MiB, followed by 8 MiB of zeros.
    segment.write_bytes(data + struct.pack(">I", 16 * 1024 * 1024) + b"{" + bytes(8 * 1024 * 1024))
    queue = Queue(tmp_path)  # zero runs are skipped, not tried byte by byte
    assert queue.stats().last_seq == 3
    queue.close()
    assert segment.read_bytes() == data
