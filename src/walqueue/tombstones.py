"""Tombstones: completed tasks, packed into shared buffers (SPEC §2: ids and keys are never reused).

A completed task never changes again. What is left of it is what put's
identity check, a stale lease's answer and the snapshot need: its id, key,
identity, counters (attempts, max_attempts, generation) and available_at. As
a Task object that costs ~500 bytes (13 slots, a 64-character identity, an
entry in two dicts); here it is ~90 bytes in a few buffers, with no Python
object per tombstone.

Layout. An index is a list of blocks in name order: block i holds the names
from `firsts[i]` up to (not including) `firsts[i + 1]`. Names are UTF-8
bytes, whose order is the order of the Python str they encode. In a block
every column is append-only, in arrival order:

    names         bytearray   the names, concatenated
    name_bounds   array('I')  name p is names[name_bounds[p]:name_bounds[p + 1]]
    values        bytearray   one value per name (b"" for none), concatenated;
    value_bounds  array('I')  likewise (both None while every value is b"")
    identities    bytearray   32 raw bytes per name (the SHA-256 digest, not its hex)
    numbers       array('I')  attempts, max_attempts, generation, available_at per name
                              (array('q') once one of them is 2**32 or more)
    order         array('I')  arrival indexes in name order; None while arrival order is name order
    hashes        array('I')  the names' hash(name) & 0xFFFFFFFF, sorted
    hashed        array('I')  the arrival index of each of those hashes

The store keeps two indexes: by task id (value: the key, b"" when it equals
the id), and, only for tombstones whose key differs from their id, by key
(value: the task id; no identities or numbers). A key is thus found without
a dict entry per tombstone: it is the id of a tombstone whose key is its id,
or a name in the key index.

Invariants:
  - names are unique within an index, and each block's are >= its first;
  - nothing is ever removed or changed. A block is only appended to; a full
    block that must take a name in its middle is replaced by two new blocks
    and itself left as it was, so a reader holding the old block list
    (`frozen()`) still walks a consistent store;
  - a block holds at most BLOCK_TOMBSTONES names, so no insertion ever costs
    more than one block's work: there is no rehash and no merge of a delta,
    and no step is O(history).

Costs: a lookup is a bisect over the blocks' first names and one over the
block's hashes (both in C), and a comparison of the name found, if any. An
insertion adds a binary search of at most log2(BLOCK_TOMBSTONES) steps for
the name's rank (none for a name after every other: ids that grow with time)
and O(BLOCK_TOMBSTONES) memmoves of `order` and the hashes. A block's two
lookups run in C on the compiled path (walqueue.speedups). The
hashes are Python's, seeded per process, and never leave it.

For a snapshot written by a fork()ed child from the copy-on-write image:
walking the store (`frozen().bodies()`) reads the buffers and writes only to
the block objects' headers (reference counts, buffer export counts), one
small object per BLOCK_TOMBSTONES tombstones, so the child copies almost
none of the parent's tombstone pages. After the child's snapshot is
published the parent has nothing to fold: the blocks are the whole store.

No I/O, no clock. The snapshot's tombstone entries are written (`bodies`) and
read back (`ENTRY`) here too, because their canonical JSON is a fixed shape
that can be formatted and matched without a JSON codec.
"""

from __future__ import annotations

import binascii
import json
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from itertools import accumulate, repeat
from operator import and_
from typing import NamedTuple

from . import speedups
from .plain_entry import ENTRY as ENTRY  # re-exported: snapshot reads it from here

BLOCK_TOMBSTONES = 512
IDENTITY_BYTES = 32
NUMBERS = 4  # attempts, max_attempts, generation, available_at
_HASH_MASK = 0xFFFFFFFF
_MAX_SMALL_NUMBER = 0xFFFFFFFF   # what numbers hold at 4 bytes each


class Tombstone(NamedTuple):
    task_id: str
    key: str
    identity: bytes      # 32 raw bytes
    attempts: int
    max_attempts: int
    generation: int
    available_at: int


# -- snapshot entries -------------------------------------------------------------
#
# A tombstone's snapshot entry (SPEC §4) in canonical JSON is a fixed shape:
# written here from the packed columns (`_ENTRY_TEMPLATE`), matched when read
# back by plain_entry.ENTRY (re-exported here; a module of its own so the
# frame codec's compiled path can name it too).

_ENTRY_TEMPLATE = (b'{"attempts":%d,"available_at":%d,"deadline":null,"generation":%d,'
                   b'"identity":"%s","key":%s,"max_attempts":%d,"payload":null,'
                   b'"status":"completed","task_id":%s,"worker":null}')
# The bytes canonical JSON escapes in a string (json.encoder's ESCAPE, as UTF-8).
_NEEDS_ESCAPE = re.compile(rb'[\x00-\x1f"\\]')


def entry_body(tombstone: Tombstone) -> bytes:
    """The canonical JSON of a tombstone's snapshot entry (equal to codec.canonical_json of it)."""
    return _ENTRY_TEMPLATE % (
        tombstone.attempts, tombstone.available_at, tombstone.generation,
        tombstone.identity.hex().encode(), _json_string(tombstone.key.encode()),
        tombstone.max_attempts, _json_string(tombstone.task_id.encode()))


def _json_string(name: bytes) -> bytes:
    if _NEEDS_ESCAPE.search(name) is None:
        return b'"' + name + b'"'
    return json.dumps(name.decode(), ensure_ascii=False).encode()


# -- blocks -----------------------------------------------------------------------

class _Block:
    """Up to BLOCK_TOMBSTONES names and their columns (see the module header)."""

    __slots__ = ("names", "name_bounds", "values", "value_bounds", "identities", "numbers",
                 "order", "hashes", "hashed")

    def __init__(self) -> None:
        self.names = bytearray()
        self.name_bounds = array("I", [0])
        self.values: bytearray | None = None
        self.value_bounds: array | None = None
        self.identities = bytearray()
        self.numbers = array("I")
        self.order: array | None = None
        self.hashes = array("I")
        self.hashed = array("I")

    def __len__(self) -> int:
        return len(self.name_bounds) - 1

    def name(self, index: int) -> bytes:
        bounds = self.name_bounds
        return bytes(self.names[bounds[index]:bounds[index + 1]])

    def value(self, index: int) -> bytes:
        bounds = self.value_bounds
        if bounds is None:
            return b""
        return bytes(self.values[bounds[index]:bounds[index + 1]])

    def _make_room(self, values, numbers) -> None:
        """Before appending: value columns once a value is not b"", 8-byte numbers once one needs them."""
        if self.value_bounds is None and any(values):
            self.values = bytearray()
            self.value_bounds = array("I", bytes(4 * (len(self) + 1)))
        if self.numbers.typecode == "I" and numbers and max(numbers) > _MAX_SMALL_NUMBER:
            self.numbers = array("q", self.numbers)

    def arrival_indexes(self, count: int | None = None) -> list[int] | range:
        """Arrival indexes in name order, of the first `count` arrivals (default all)."""
        if count is None:
            count = len(self)
        if self.order is None:
            return range(count)
        return [index for index in self.order if index < count]

    def find(self, name: bytes) -> int:
        """The arrival index of `name`, or -1."""
        hashes, key = self.hashes, hash(name) & _HASH_MASK
        position = bisect_left(hashes, key)
        while position < len(hashes) and hashes[position] == key:
            index = self.hashed[position]
            if self.names[self.name_bounds[index]:self.name_bounds[index + 1]] == name:
                return index
            position += 1
        return -1

    def search(self, name: bytes) -> tuple[int, int]:
        """(rank, arrival index) of `name`, or (the rank it would take, -1)."""
        names, bounds, order = self.names, self.name_bounds, self.order
        low, high = 0, len(bounds) - 1
        count = high
        while low < high:
            middle = (low + high) >> 1
            index = middle if order is None else order[middle]
            if names[bounds[index]:bounds[index + 1]] < name:
                low = middle + 1
            else:
                high = middle
        if low < count:
            index = low if order is None else order[low]
            if names[bounds[index]:bounds[index + 1]] == name:
                return low, index
        return low, -1

    def insert(self, rank: int, name: bytes, value: bytes, identity: bytes, numbers) -> None:
        index = len(self.name_bounds) - 1
        if (value and self.value_bounds is None) or (
                numbers and self.numbers.typecode == "I" and max(numbers) > _MAX_SMALL_NUMBER):
            self._make_room((value,), numbers)   # (rare: every insert before needed neither)
        self.names += name
        self.name_bounds.append(len(self.names))
        if self.values is not None:
            self.values += value
            self.value_bounds.append(len(self.values))
        self.identities += identity
        self.numbers.extend(numbers)
        key = hash(name) & _HASH_MASK
        position = bisect_left(self.hashes, key)
        self.hashes.insert(position, key)
        self.hashed.insert(position, index)
        if self.order is None:
            if rank == index:
                return
            self.order = array("I", range(index))
        self.order.insert(rank, index)

    def extend(self, names: list[bytes], values: list[bytes], identities: bytes,
               numbers: array) -> None:
        """Append names that all follow this block's last, in order."""
        first = len(self)
        self._make_room(values, numbers)
        for buffer, bounds, items in ((self.names, self.name_bounds, names),
                                      (self.values, self.value_bounds, values)):
            if bounds is not None:
                start = bounds.pop()
                bounds.extend(accumulate(map(len, items), initial=start))
                buffer += b"".join(items)
        self.identities += identities
        self.numbers.extend(numbers if type(numbers) is not array
                            or numbers.typecode == self.numbers.typecode
                            else array(self.numbers.typecode, numbers))
        if self.order is not None:
            self.order.extend(range(first, len(self)))
        keys = list(self.hashes)
        keys += map(and_, map(hash, names), repeat(_HASH_MASK))
        indexes = list(self.hashed)
        indexes += range(first, len(self))
        by_key = sorted(range(len(keys)), key=keys.__getitem__)
        self.hashes = array("I", map(keys.__getitem__, by_key))
        self.hashed = array("I", map(indexes.__getitem__, by_key))

    def trim(self) -> None:
        """Copy the growable columns to their exact sizes, for a block that is full."""
        for column in ("names", "name_bounds", "values", "value_bounds", "identities",
                       "numbers", "hashes", "hashed"):
            value = getattr(self, column)
            if value is not None:
                setattr(self, column, type(value)(value) if type(value) is bytearray
                        else array(value.typecode, value))

    @classmethod
    def packed(cls, names: bytes, bounds: bytes, identities: bytes, numbers: bytes, wide: bool,
               hashes: bytes, hashed: bytes) -> _Block:
        """A block of names in arrival = name order, from columns packed elsewhere (machine-order
        uint32 bounds, hashes and hashed, numbers uint32 or, `wide`, int64), as `extend` builds it."""
        block = cls()
        block.names = bytearray(names)
        block.name_bounds = _packed_array("I", bounds)
        block.identities = bytearray(identities)
        block.numbers = _packed_array("q" if wide else "I", numbers)
        block.hashes = _packed_array("I", hashes)
        block.hashed = _packed_array("I", hashed)
        return block

    def name_range(self, count: int) -> tuple[bytes, bytes]:
        """The least and the greatest of the first `count` arrivals' names (count >= 1)."""
        indexes = self.arrival_indexes(count)
        return self.name(indexes[0]), self.name(indexes[-1])

    def columns(self, indexes) -> tuple[list[bytes], list[bytes], bytes, array]:
        """The columns of the given arrivals, in that order (to build a new block)."""
        buffer, bounds = self.names, self.name_bounds
        names = [bytes(buffer[bounds[index]:bounds[index + 1]]) for index in indexes]
        values = [self.value(index) for index in indexes] if self.value_bounds is not None else (
            [b""] * len(indexes))
        column = memoryview(self.identities)
        identities = b"".join([column[IDENTITY_BYTES * index:IDENTITY_BYTES * (index + 1)]
                               for index in indexes])
        column.release()
        numbers = self.numbers
        return names, values, identities, array(numbers.typecode, [
            number for index in indexes for number in numbers[NUMBERS * index:NUMBERS * (index + 1)]])


class _Index:
    """Blocks of unique names in name order, each name with a value (and maybe numbers)."""

    def __init__(self) -> None:
        self.blocks: list[_Block] = []
        self.firsts: list[bytes] = []
        self.count = 0
        # The greatest name: ids that grow with time (the common case) are
        # then told apart from every tombstone, and appended, without a search.
        self.last = b""

    def find(self, name: bytes) -> tuple[_Block, int] | None:
        """The block and arrival index holding `name`, or None."""
        if name > self.last or not self.blocks:
            return None
        block = self.blocks[max(bisect_right(self.firsts, name) - 1, 0)]
        index = _find(block, name)
        return None if index < 0 else (block, index)

    def add(self, name: bytes, value: bytes, identity: bytes = b"", numbers=()) -> None:
        """Insert a name not in the index yet."""
        blocks, firsts = self.blocks, self.firsts
        if not blocks:
            blocks.append(_Block())
            firsts.append(name)
        if name > self.last:
            position = len(blocks) - 1
            block = blocks[position]
            rank = len(block)
            self.last = name
        else:
            position = max(bisect_right(firsts, name) - 1, 0)
            block = blocks[position]
            rank, index = _search(block, name)
            assert index < 0, f"{name!r} is already in the index"
        if len(block) >= BLOCK_TOMBSTONES:
            if position == len(blocks) - 1 and rank == len(block):
                # Names arriving in order (the common case) fill blocks to the
                # brim; the full one keeps no room to grow.
                block.trim()
                block = _Block()
                blocks.append(block)
                firsts.append(name)
                position += 1
            else:
                self._split(position)
                if name >= firsts[position + 1]:
                    position += 1
                block = blocks[position]
            rank = _search(block, name)[0]
        block.insert(rank, name, value, identity, numbers)
        if rank == 0:
            firsts[position] = name
        self.count += 1

    def _split(self, position: int) -> None:
        """Replace a full block by two new ones holding its halves (the old one stays intact)."""
        old = self.blocks[position]
        indexes = list(old.arrival_indexes())
        halves = []
        for part in (indexes[:len(indexes) // 2], indexes[len(indexes) // 2:]):
            block = _Block()
            block.extend(*old.columns(part))
            halves.append(block)
        self.blocks[position:position + 1] = halves
        self.firsts[position:position + 1] = [halves[0].name(0), halves[1].name(0)]

    def extend(self, names: list[bytes], values: list[bytes], identities: bytes,
               numbers: array) -> None:
        """Append names that all follow the last name of the index, in order."""
        start = 0
        while start < len(names):
            if not self.blocks or len(self.blocks[-1]) >= BLOCK_TOMBSTONES:
                self.blocks.append(_Block())
                self.firsts.append(names[start])
            block = self.blocks[-1]
            stop = min(len(names), start + BLOCK_TOMBSTONES - len(block))
            block.extend(names[start:stop], values[start:stop],
                         identities[IDENTITY_BYTES * start:IDENTITY_BYTES * stop],
                         numbers[NUMBERS * start:NUMBERS * stop])
            start = stop
        self.count += len(names)
        if names:
            self.last = names[-1]


# The lookups, as the indexes and the store call them: _Block's and _Index's methods (the
# reference), or their compiled twins (_tombstones.c), which take the block or the index and the
# name and answer the same.
_find = _Block.find if not speedups.COMPILED else speedups.speedups.block_find
_search = _Block.search if not speedups.COMPILED else speedups.speedups.block_search
_index_find = _Index.find if not speedups.COMPILED else speedups.speedups.index_find


# -- the store --------------------------------------------------------------------

class TombstoneStore:
    """Every completed task, by task id and by key (see the module header)."""

    def __init__(self) -> None:
        self._by_id = _Index()
        self._by_key = _Index()   # only the tombstones whose key is not their id

    def __len__(self) -> int:
        return self._by_id.count

    def __contains__(self, task_id: str) -> bool:
        return _index_find(self._by_id, _utf8(task_id)) is not None

    def get(self, task_id: str) -> Tombstone | None:
        found = _index_find(self._by_id, _utf8(task_id))
        return None if found is None else _tombstone(*found)

    def get_by_key(self, key: str) -> Tombstone | None:
        """The tombstone whose key is `key`, or None."""
        name = _utf8(key)
        found = _index_find(self._by_id, name)
        if found is not None and not found[0].value(found[1]):
            return _tombstone(*found)   # its key is its id
        if self._by_key.count:
            found = _index_find(self._by_key, name)
            if found is not None:
                return self.get(found[0].value(found[1]).decode())
        return None

    def has_key(self, key: str) -> bool:
        return self.get_by_key(key) is not None

    def has_other_keys(self) -> bool:
        """True if some tombstone's key is not its id."""
        return self._by_key.count > 0

    def add(self, task_id: str, key: str, identity: bytes, attempts: int, max_attempts: int,
            generation: int, available_at: int) -> None:
        """Add a tombstone; its id and key must not be any tombstone's yet."""
        assert len(identity) == IDENTITY_BYTES
        name = task_id.encode()
        other_key = b"" if key == task_id else key.encode()
        self._by_id.add(name, other_key, identity,
                        (attempts, max_attempts, generation, available_at))
        if other_key:
            self._by_key.add(other_key, name)

    def extend(self, task_ids: list[bytes], identities: bytes, numbers: array) -> None:
        """Append tombstones whose key is their id, with ids (UTF-8) ascending after every id here.

        `identities` holds 32 raw bytes per tombstone and `numbers` attempts,
        max_attempts, generation, available_at per tombstone.
        """
        self._by_id.extend(task_ids, [b""] * len(task_ids), identities, numbers)

    def packed_room(self) -> int:
        """How many tombstones `append_packed` takes next: the room left in the last block."""
        blocks = self._by_id.blocks
        if not blocks or len(blocks[-1]) >= BLOCK_TOMBSTONES:
            return BLOCK_TOMBSTONES
        return BLOCK_TOMBSTONES - len(blocks[-1])

    def append_packed(self, names: bytes, bounds: bytes, identities: bytes, numbers: bytes,
                      wide: bool, hashes: bytes, hashed: bytes) -> None:
        """`extend` for at most `packed_room()` tombstones given as one block's packed columns
        (see _Block.packed), with no Python object per tombstone once the last block is full."""
        index = self._by_id
        block = _Block.packed(names, bounds, identities, numbers, wide, hashes, hashed)
        count = len(block)
        assert 0 < count <= self.packed_room()
        if index.blocks and len(index.blocks[-1]) < BLOCK_TOMBSTONES:
            # Fill the last block up the ordinary way (once: the blocks then stay aligned).
            task_ids = [block.name(position) for position in range(count)]
            self.extend(task_ids, block.identities, block.numbers)
            return
        index.blocks.append(block)
        index.firsts.append(block.name(0))
        index.count += count
        index.last = block.name(count - 1)

    def after(self, name: bytes | None) -> Iterator[tuple[bytes, Tombstone]]:
        """(task id as UTF-8, Tombstone) of the ids greater than `name` (all for None), in order.

        A page's walk (walqueue.listing): it starts by bisection, so a page of
        k costs O(log n + k + BLOCK_TOMBSTONES), never O(n). It reads the
        store as it is: take what you need before the next `add`.
        """
        index = self._by_id
        blocks = index.blocks
        if name is None:
            position, rank = 0, 0
        else:
            position = max(bisect_right(index.firsts, name) - 1, 0)
            if not blocks:
                return
            rank, found = _search(blocks[position], name)
            if found >= 0:
                rank += 1
        for block in blocks[position:]:
            arrivals = block.arrival_indexes()
            for arrival in arrivals[rank:]:
                yield block.name(arrival), _tombstone(block, arrival)
            rank = 0

    def frozen(self) -> _Frozen:
        """The tombstones there are now, to walk in task id order while more are added."""
        return _Frozen([(block, len(block)) for block in self._by_id.blocks])


class _Frozen:
    """The store as it was when `frozen()` was called: blocks and how many names each had."""

    def __init__(self, blocks: list[tuple[_Block, int]]) -> None:
        self._blocks = blocks

    def __iter__(self) -> Iterator[tuple[bytes, Tombstone]]:
        """(task id as UTF-8, Tombstone) in task id order."""
        for block, count in self._blocks:
            for index in block.arrival_indexes(count):
                yield block.name(index), _tombstone(block, index)

    def blocks(self) -> list[tuple[_Block, int]]:
        """The blocks in name order, each with how many of its arrivals are in the frozen store."""
        return self._blocks

    def bodies(self) -> Iterator[tuple[bytes, bytes]]:
        """(task id as UTF-8, the canonical JSON of its snapshot entry) in task id order."""
        for block, count in self._blocks:
            yield from block_bodies(block, count)


def block_bodies(block: _Block, count: int) -> Iterator[tuple[bytes, bytes]]:
    """(task id, snapshot entry) of a block's first `count` arrivals, in task id order."""
    template = _ENTRY_TEMPLATE
    names, name_bounds = bytes(block.names), block.name_bounds
    value_bounds = block.value_bounds
    values = b"" if value_bounds is None else bytes(block.values)
    plain = (_NEEDS_ESCAPE.search(names) is None
             and _NEEDS_ESCAPE.search(values) is None)
    hexes = binascii.hexlify(block.identities)
    numbers = block.numbers
    for index in block.arrival_indexes(count):
        name = names[name_bounds[index]:name_bounds[index + 1]]
        key = name if value_bounds is None else (
            values[value_bounds[index]:value_bounds[index + 1]] or name)
        if plain:
            name_json, key_json = b'"' + name + b'"', b'"' + key + b'"'
        else:
            name_json, key_json = _json_string(name), _json_string(key)
        first = NUMBERS * index
        attempts, max_attempts, generation, available_at = numbers[first:first + NUMBERS]
        yield name, template % (attempts, available_at, generation,
                                hexes[2 * IDENTITY_BYTES * index:
                                      2 * IDENTITY_BYTES * (index + 1)],
                                key_json, max_attempts, name_json)


def _packed_array(typecode: str, packed: bytes) -> array:
    column = array(typecode)
    column.frombytes(packed)
    return column


def _utf8(name: str) -> bytes:
    # A lone surrogate (only in a name no check has seen yet) matches no stored name.
    return name.encode("utf-8", "surrogatepass")


def _tombstone(block: _Block, index: int) -> Tombstone:
    name = block.name(index)
    key = block.value(index) or name
    first = NUMBERS * index
    attempts, max_attempts, generation, available_at = block.numbers[first:first + NUMBERS]
    return Tombstone(name.decode(), key.decode(),
                     bytes(block.identities[IDENTITY_BYTES * index:IDENTITY_BYTES * (index + 1)]),
                     attempts, max_attempts, generation, available_at)
