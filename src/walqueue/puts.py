"""How put requests resolve (SPEC §2): a request's identity, and a list of them against a store.

Pure functions over validated requests (validation.put_request). The rules
are the same for every backend: an identical retry (same key, same
identity) resolves to the task already put, any other collision is a
KeyConflict. `State.plan_put` runs them against the queue's tasks and
tombstones; `plan_puts` alone (nothing stored) is the rules inside one
list, which walqueue.pg applies before its store's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from .codec import canonical_json
from .errors import KeyConflict

_sha256 = hashlib.sha256


def identity_of(task_id: str, payload: dict, available_at: int, max_attempts: int) -> str:
    """The identity of a put request (SPEC §2), with its ORIGINAL available_at."""
    return identity_digest(task_id, payload, available_at, max_attempts).hex()


def identity_digest(task_id: str, payload: dict, available_at: int, max_attempts: int) -> bytes:
    """identity_of as its 32 raw bytes (what a tombstone stores: no hex round trip)."""
    request = {"available_at": available_at, "max_attempts": max_attempts,
               "payload": payload, "task_id": task_id}
    return _sha256(canonical_json(request)).digest()


def identity_of_request(request: dict) -> str:
    return identity_of(request["task_id"], request["payload"], request["available_at"],
                       request["max_attempts"])


def _nothing(_: str) -> None:
    return None


def plan_puts(requests: list[dict], *,
              owner_of_key: Callable[[str], tuple[str, str] | None] = _nothing,
              key_of_task: Callable[[str], str | None] = _nothing) -> tuple[list[str], list[dict]]:
    """Resolve validated put requests against a store; by default an empty one.

    ``owner_of_key(key)`` is the (task id, identity) of the stored task that
    holds the key, or None; ``key_of_task(task_id)`` the key of the stored
    task with that id, or None. Returns the task id for each request and the
    requests that are new, in request order. Raises KeyConflict for a
    collision that is not an identical retry.
    """
    ids: list[str] = []
    new: list[dict] = []
    new_by_key: dict[str, tuple[dict, str | None]] = {}
    new_ids: set[str] = set()
    for request in requests:
        key = request["key"]
        owner = owner_of_key(key)
        if owner is not None:
            existing_id, existing_identity = owner
            if identity_of_request(request) != existing_identity:
                raise KeyConflict(
                    f"key {key!r} is already used by task {existing_id!r} "
                    f"with a different request")
            ids.append(existing_id)
            continue
        if key in new_by_key:
            earlier, identity = new_by_key[key]
            if identity is None:
                identity = identity_of_request(earlier)
                new_by_key[key] = (earlier, identity)
            if identity_of_request(request) != identity:
                raise KeyConflict(f"key {key!r} appears twice in the batch with different requests")
            ids.append(earlier["task_id"])
            continue
        task_id = request["task_id"]
        existing_key = key_of_task(task_id)
        if existing_key is not None:
            raise KeyConflict(f"task id {task_id!r} is already used "
                              f"(under key {existing_key!r})")
        if task_id in new_ids:
            raise KeyConflict(f"task id {task_id!r} appears twice in the batch under different keys")
        new_by_key[key] = (request, None)
        new_ids.add(task_id)
        new.append(request)
        ids.append(task_id)
    return ids, new
