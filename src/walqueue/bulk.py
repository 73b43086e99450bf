"""Snapshot tombstones in bulk: loaded from and written as whole blocks of frames (issue 22).

Two paths of the snapshot reader and writer that the extension makes fast
(walqueue.speedups decides which runs), each with the reference beside it:

  - `load_packed_tombstones` takes the next run of a snapshot's plain
    tombstone entries (tombstones.ENTRY) into the store as one block's
    packed columns: the extension checks each frame's length and digest,
    matches the entry and the rules State.load_plain_tombstones checks, and
    stops before the first frame it cannot take, which the reference
    reader (snapshot._load_plain_tombstones) then reads, and raises for if
    it is bad. No Python object is made per tombstone.
  - `entry_frames` yields the frames of every snapshot entry in task_id
    order, byte for byte what framing State.entry_bodies gives, but a block
    of tombstones with no live task among them as one bytes object encoded
    and hashed in C.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import speedups
from .codec import canonical_json, frame_of_body
from .state import COMPLETED, State
from .tombstones import block_bodies


def load_packed_tombstones(state: State, data, offset: int) -> tuple[int, int] | None:
    """Load the plain tombstone entries at `offset` the extension can take: (end offset, how many).

    None when it takes none (or the extension is not there, or keys other
    than ids are in the store, which it does not check): the reference
    reader goes on from `offset`.
    """
    tombstones = state.tombstones
    if not speedups.COMPILED or tombstones.has_other_keys():
        return None
    taken = state.task_id_by_key or None
    # _last_loaded: the task id of the last entry loaded (State.load_entry's order rule).
    last_id = state._last_loaded.encode("utf-8", "surrogatepass")
    columns = speedups.speedups.load_tombstones(data, offset, tombstones.packed_room(), last_id, taken)
    if columns is None:
        return None
    end, count, names, bounds, identities, numbers, wide, hashes, hashed = columns
    tombstones.append_packed(names, bounds, identities, numbers, bool(wide), hashes, hashed)
    state.counts[COMPLETED] += count
    last = memoryview(bounds).cast("I")
    state._last_loaded = names[last[count - 1]:last[count]].decode()
    return end, count


def entry_frames(state: State) -> Iterator[bytes]:
    """The frames of every snapshot entry, in task_id order, as bytes of one frame or many."""
    tasks = state.tasks
    live = sorted(tasks)
    position, count = 0, len(live)
    upcoming = live[0].encode() if live else None

    def live_frame() -> bytes:
        nonlocal position, upcoming
        frame = frame_of_body(canonical_json(tasks[live[position]].entry()))
        position += 1
        upcoming = live[position].encode() if position < count else None
        return frame

    for block, taken in state.tombstones.frozen().blocks():
        if not taken:
            continue
        first, last = block.name_range(taken)
        while upcoming is not None and upcoming < first:
            yield live_frame()
        if upcoming is not None and upcoming < last:
            # A live task among this block's tombstones: merge them one by one.
            for name, body in block_bodies(block, taken):
                while upcoming is not None and upcoming < name:
                    yield live_frame()
                yield frame_of_body(body)
        else:
            yield block_frames(block, taken)
    while upcoming is not None:
        yield live_frame()


def block_frames(block, count: int) -> bytes:
    """The snapshot frames of a block's first `count` tombstones, in task_id order."""
    if speedups.COMPILED:
        return speedups.speedups.tombstone_frames(
            block.names, block.name_bounds, block.values, block.value_bounds, block.identities,
            block.numbers, block.order, count)
    return b"".join([frame_of_body(body) for _, body in block_bodies(block, count)])
