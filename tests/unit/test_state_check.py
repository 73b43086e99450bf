"""State.check of a put record and of a seq: what it refuses and how it says so (SPEC §4, §5).

State.check tells the common case (plain fields, the next seq) in one
expression and builds an error's field names only for a record that fails
(issue 22): these pin that every value the validation functions refuse is
still refused, with the message naming the task and field, and that what
they accept (a non-ASCII name) still passes.
"""

from __future__ import annotations

import pytest

from walqueue.errors import InvalidRequest
from walqueue.state import State
from walqueue.validation import MAX_INT, MAX_NAME_BYTES


def put_task(number: int, **fields) -> dict:
    task = {"available_at": 0, "key": f"k{number}", "max_attempts": 3, "payload": {"n": number},
            "task_id": f"t{number}"}
    task.update(fields)
    return task


def put_record(*tasks: dict, seq: object = 1) -> dict:
    return {"op": "put", "seq": seq, "tasks": list(tasks)}


BAD_FIELDS = [
    ("task_id", 7, "tasks[1].task_id must be a str, not int"),
    ("task_id", "", "tasks[1].task_id must not be empty"),
    ("task_id", "x" * (MAX_NAME_BYTES + 1), f"tasks[1].task_id is {MAX_NAME_BYTES + 1} bytes as UTF-8"),
    ("task_id", "é" * 513, "tasks[1].task_id is 1026 bytes as UTF-8"),
    ("task_id", "\ud800", "tasks[1].task_id '\\ud800' is not encodable as UTF-8"),
    ("key", None, "tasks[1].key must be a str, not NoneType"),
    ("key", "x" * (MAX_NAME_BYTES + 1), "tasks[1].key is 1025 bytes"),
    ("available_at", -1, "tasks[1].available_at=-1 is out of range"),
    ("available_at", MAX_INT + 1, "tasks[1].available_at=9223372036854775808 is out of range"),
    ("available_at", True, "tasks[1].available_at must be an int, not bool"),
    ("available_at", 1.0, "tasks[1].available_at must be an int, not float"),
    ("max_attempts", 0, "tasks[1].max_attempts=0 is out of range"),
    ("max_attempts", True, "tasks[1].max_attempts must be an int, not bool"),
    ("payload", [], "tasks[1].payload must be an object"),
    ("payload", None, "tasks[1].payload must be an object"),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD_FIELDS,
                         ids=[f"{field}={value!r:.20}" for field, value, _ in BAD_FIELDS])
def test_a_put_record_with_a_bad_task_field_is_refused_naming_the_task_and_field(field, value, message):
    state = State()
    with pytest.raises(InvalidRequest) as refused:
        state.check(put_record(put_task(0), put_task(1, **{field: value})))
    assert str(refused.value).startswith(message)
    assert state.last_seq == 0 and not state.tasks


@pytest.mark.parametrize("task", [
    {"available_at": 0, "key": "k", "max_attempts": 3, "payload": {}},   # no task_id
    {**put_task(1), "extra": 1},
    ["not", "an", "object"],
], ids=["missing field", "extra field", "a list"])
def test_a_put_record_task_without_exactly_its_fields_is_refused(task):
    with pytest.raises(InvalidRequest, match=r"^tasks\[1\] must be an object with fields"):
        State().check(put_record(put_task(0), task))


def test_names_beyond_ascii_and_values_at_their_bounds_still_pass():
    state = State()
    task = put_task(0, task_id="tâche-é", key="clé-" + "é" * 500, available_at=MAX_INT,
                    max_attempts=MAX_INT)
    state.apply(put_record(task))
    assert state.get("tâche-é").key == "clé-" + "é" * 500 and state.last_seq == 1


@pytest.mark.parametrize(("seq", "message"), [
    (2, "seq 2 does not follow seq 0"),
    (0, "seq=0 is out of range [1, "),
    (True, "seq must be an int, not bool"),
    ("1", "seq must be an int, not str"),
    (MAX_INT + 1, "seq=9223372036854775808 is out of range"),
])
def test_a_record_whose_seq_is_not_the_next_one_is_refused_saying_why(seq, message):
    with pytest.raises(InvalidRequest) as refused:
        State().check(put_record(put_task(0), seq=seq))
    assert str(refused.value).startswith(message)
