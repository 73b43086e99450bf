/* walqueue._speedups.Applier: the compiled twin of State.apply for the records of the
 * common traffic, put, reserve and ack (issue 22), which is what WAL replay spends its time on.
 *
 * The reference is walqueue/state.py: `check` decides, `commit` changes. An Applier is
 * made for one State (walqueue/replay.py) and called as `applier(record, body_bytes)`,
 * exactly as `state.apply`. For a record it can decide it runs the same checks and then
 * the same changes, in the same order, on the same Python objects (Task, the dicts, the
 * heaps; the listing index, the tombstone store and the monitoring figures through their
 * own methods), so the state after it is the state after State.apply. Anything else, any
 * other op, every record a check would reject, a shape it does not know, it declines
 * before changing anything and calls `state.apply` itself: what is rejected, and with
 * which error, is always the reference's answer. tests/unit/test_replay_twin.py compares
 * the two on random traffic and on records that fail every check.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>

int add_applier(PyObject *module);

#define MAX_TARGETS 1000      /* validation.MAX_RESERVE_LIMIT, checked at construction */

typedef struct {
    PyObject_HEAD
    PyObject *state, *fallback, *fallback_check, *fallback_commit, *checked, *task_type, *identity_digest, *fromhex, *heappush;
    PyObject *tasks, *task_id_by_key, *counts, *ready_heap, *lease_heap;
    PyObject *tomb_contains, *tomb_has_key, *tomb_add;
    PyObject *ready_add, *ready_discard, *leased_add, *leased_discard;
    PyObject *became_ready, *lease_started, *lease_ended, *tidy_ready, *tidy_halves, *tidy;
    PyObject *READY, *LEASED, *COMPLETED;
    long long put_extra, reserve_base, ack_base;
    Py_ssize_t max_name;
    long long applied, declined;   /* records each way, for the tests and the curious */
} Applier;

/* Interned names: record fields and Task/State attributes. */
static PyObject *s_op, *s_seq, *s_tasks, *s_task_id, *s_key, *s_available_at, *s_max_attempts,
    *s_payload, *s_now, *s_lease_seconds, *s_task_ids, *s_worker, *s_generation, *s_put,
    *s_reserve, *s_ack, *s_status, *s_attempts, *s_deadline, *s_lease_start, *s_identity,
    *s_last_seq, *s_snapshot_growth;

#define DECLINE 0
#define DONE 1
#define FAILED -1

/* What a call does with a record. APPLY is State.apply (replay). A writer (the Engine) checks
 * before it writes the record's frame and commits after: CHECK runs every check and changes
 * nothing, COMMIT makes the changes of the record CHECK passed last (a put's conflict checks,
 * which call into the tombstone store, are not run again; the others are, and must pass). */
#define APPLY 0
#define CHECK 1
#define COMMIT 2

/* An int (never a bool) with low <= value <= LLONG_MAX: validation.integer's accepted case. */
static int small_int(PyObject *value, long long low, long long *out)
{
    if (value == NULL || !PyLong_CheckExact(value)) return 0;
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (number < low) return 0;
    *out = number;
    return 1;
}

/* validation.name's fast case: a non-empty ASCII str of at most max_name bytes. */
static int plain_name(PyObject *value, Py_ssize_t max_name)
{
    if (value == NULL || !PyUnicode_CheckExact(value) || !PyUnicode_IS_ASCII(value)) return 0;
    Py_ssize_t size = PyUnicode_GET_LENGTH(value);
    return size > 0 && size <= max_name;
}

static long long digits(long long number)   /* snapshot_size._digits, number >= 0 */
{
    long long count = 1;
    while (number >= 10) {
        number /= 10;
        count++;
    }
    return count;
}

/* snapshot_size._name_bytes of an ASCII str: its canonical JSON's length (json's escapes). */
static long long json_name_bytes(PyObject *name)
{
    const unsigned char *text = PyUnicode_1BYTE_DATA(name);
    Py_ssize_t size = PyUnicode_GET_LENGTH(name);
    long long total = 2;
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = text[i];
        if (c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t')
            total += 2;
        else if (c < 0x20)
            total += 6;
        else
            total += 1;
    }
    return total;
}

/* The exact field set of State.RECORD_FIELDS[op]: `count` fields, all of them present. */
static int has_fields(PyObject *record, PyObject **const *names, Py_ssize_t count,
                      PyObject **values)
{
    if (PyDict_GET_SIZE(record) != count) return 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        values[i] = PyDict_GetItemWithError(record, *names[i]);
        if (values[i] == NULL) return PyErr_Occurred() ? FAILED : 0;
    }
    return 1;
}

static int same_str(PyObject *a, PyObject *b)   /* a == b for two str; -1 with an error */
{
    if (a == b) return 1;
    if (!PyUnicode_Check(a) || !PyUnicode_Check(b)) return 0;
    int compared = PyUnicode_Compare(a, b);
    if (compared == -1 && PyErr_Occurred()) return -1;
    return compared == 0;
}

static int truthy_call(PyObject *callable, PyObject *arg)   /* bool(callable(arg)), -1 on error */
{
    PyObject *result = PyObject_CallOneArg(callable, arg);
    if (result == NULL) return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

static int call_void(PyObject *callable, PyObject *const *args, size_t count)
{
    PyObject *result = PyObject_Vectorcall(callable, args, count, NULL);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

static int task_int(PyObject *task, PyObject *name, long long *out)   /* an int attribute */
{
    PyObject *value = PyObject_GetAttr(task, name);
    if (value == NULL) return -1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    Py_DECREF(value);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "task field beyond 64 bits");
        return -1;
    }
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_int(PyObject *object, PyObject *name, long long number)
{
    PyObject *value = PyLong_FromLongLong(number);
    if (value == NULL) return -1;
    int result = PyObject_SetAttr(object, name, value);
    Py_DECREF(value);
    return result;
}

static int counts_add(Applier *self, PyObject *status, long long delta)   /* counts[status] += delta */
{
    PyObject *value = PyDict_GetItemWithError(self->counts, status);
    if (value == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, status);
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) return -1;
    PyObject *updated = PyLong_FromLongLong(number + delta);
    if (updated == NULL) return -1;
    int result = PyDict_SetItem(self->counts, status, updated);
    Py_DECREF(updated);
    return result;
}

static int count_of(Applier *self, PyObject *status, long long *out)
{
    PyObject *value = PyDict_GetItemWithError(self->counts, status);
    if (value == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, status);
        return -1;
    }
    *out = PyLong_AsLongLong(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int add_growth(Applier *self, long long growth)   /* state.snapshot_growth += growth */
{
    long long total;
    if (task_int(self->state, s_snapshot_growth, &total) < 0) return -1;
    return set_int(self->state, s_snapshot_growth, total + growth);
}

static int push(Applier *self, PyObject *heap, PyObject *time, PyObject *task_id)
{
    PyObject *entry = PyTuple_Pack(2, time, task_id);
    if (entry == NULL) return -1;
    PyObject *args[2] = {heap, entry};
    int result = call_void(self->heappush, args, 2);
    Py_DECREF(entry);
    return result;
}

/* State._tidy(heap, status): the heap is filtered by the reference when it is due (rare). */
static int tidy(Applier *self, PyObject *heap, PyObject *status, int ready)
{
    long long count;
    if (count_of(self, status, &count) < 0) return -1;
    if (PyList_GET_SIZE(heap) > 2 * count + 1024) {
        PyObject *args[2] = {heap, status};
        return call_void(self->tidy, args, 2);
    }
    if (!ready) return 0;
    PyObject *number = PyLong_FromLongLong(count);
    if (number == NULL) return -1;
    PyObject *args[2] = {self->tasks, number};
    int result = call_void(self->tidy_ready, args, 2);
    Py_DECREF(number);
    return result;
}

/* -------------------------------------------------------------------- put */

static PyObject **put_task_fields[5] = {&s_available_at, &s_key, &s_max_attempts, &s_payload,
                                        &s_task_id};

static int put(Applier *self, PyObject *record, PyObject *seq, PyObject *body_bytes, int mode)
{
    PyObject *tasks = PyDict_GetItemWithError(record, s_tasks);
    long long body = 0;
    if (tasks == NULL || !PyList_CheckExact(tasks) || PyList_GET_SIZE(tasks) == 0
        || (mode != CHECK && !small_int(body_bytes, 0, &body)))
        return PyErr_Occurred() ? FAILED : DECLINE;
    Py_ssize_t count = PyList_GET_SIZE(tasks);
    PyObject *new_ids = NULL, *new_keys = NULL;
    if (mode == COMMIT) goto commit;
    if (count > 1 && ((new_ids = PySet_New(NULL)) == NULL || (new_keys = PySet_New(NULL)) == NULL))
        goto failed;
    for (Py_ssize_t i = 0; i < count; i++) {   /* State._check_put, _put_task_names */
        PyObject *task = PyList_GET_ITEM(tasks, i), *fields[5];
        long long number;
        if (!PyDict_CheckExact(task) || PyDict_GET_SIZE(task) != 5) goto declined;
        for (int f = 0; f < 5; f++) {
            fields[f] = PyDict_GetItemWithError(task, *put_task_fields[f]);
            if (fields[f] == NULL) goto declined;
        }
        PyObject *key = fields[1], *task_id = fields[4];
        if (!plain_name(task_id, self->max_name) || !plain_name(key, self->max_name)
            || !small_int(fields[0], 0, &number) || !small_int(fields[2], 1, &number)
            || !PyDict_CheckExact(fields[3]))
            goto declined;
        int taken = new_keys != NULL ? PySet_Contains(new_keys, key) : 0;
        if (taken == 0) taken = PyDict_Contains(self->task_id_by_key, key);
        if (taken == 0) taken = truthy_call(self->tomb_has_key, key);
        if (taken == 0 && new_ids != NULL) taken = PySet_Contains(new_ids, task_id);
        if (taken == 0) taken = PyDict_Contains(self->tasks, task_id);
        if (taken == 0) taken = truthy_call(self->tomb_contains, task_id);
        if (taken < 0) goto failed;
        if (taken) goto declined;   /* the reference raises KeyConflict */
        if (new_ids != NULL && (PySet_Add(new_keys, key) < 0 || PySet_Add(new_ids, task_id) < 0))
            goto failed;
    }
    Py_XDECREF(new_ids);
    Py_XDECREF(new_keys);
    new_ids = new_keys = NULL;
    if (mode == CHECK) return DONE;

commit:
    if (add_growth(self, body + count * self->put_extra) < 0) return FAILED;
    PyObject *zero = PyLong_FromLong(0);   /* immortal small int */
    for (Py_ssize_t i = 0; i < count; i++) {   /* State._commit_put */
        PyObject *fields = PyList_GET_ITEM(tasks, i);
        PyObject *available_at = PyDict_GetItem(fields, s_available_at);
        PyObject *key = PyDict_GetItem(fields, s_key);
        PyObject *max_attempts = PyDict_GetItem(fields, s_max_attempts);
        PyObject *payload = PyDict_GetItem(fields, s_payload);
        PyObject *task_id = PyDict_GetItem(fields, s_task_id);
        PyObject *args[12] = {task_id, key, Py_None, self->READY, zero, max_attempts, zero,
                              available_at, Py_None, Py_None, payload, seq};
        PyObject *task = PyObject_Vectorcall(self->task_type, args, 12, NULL);
        if (task == NULL) return FAILED;
        int stored = PyDict_SetItem(self->tasks, task_id, task);
        Py_DECREF(task);
        if (stored < 0 || PyDict_SetItem(self->task_id_by_key, key, task_id) < 0
            || call_void(self->ready_add, &task_id, 1) < 0
            || counts_add(self, self->READY, 1) < 0
            || push(self, self->ready_heap, available_at, task_id) < 0)
            return FAILED;
        PyObject *ready_args[2] = {seq, task_id};
        if (call_void(self->became_ready, ready_args, 2) < 0) return FAILED;
    }
    if (tidy(self, self->ready_heap, self->READY, 1) < 0) return FAILED;
    return DONE;

declined:
    Py_XDECREF(new_ids);
    Py_XDECREF(new_keys);
    return PyErr_Occurred() ? FAILED : DECLINE;
failed:
    Py_XDECREF(new_ids);
    Py_XDECREF(new_keys);
    return FAILED;
}

/* ---------------------------------------------------------------- reserve */

static PyObject **reserve_fields[6] = {&s_lease_seconds, &s_now, &s_op, &s_seq, &s_task_ids,
                                       &s_worker};

static int reserve(Applier *self, PyObject *record, int mode)
{
    PyObject *values[6];
    int shape = has_fields(record, reserve_fields, 6, values);
    if (shape <= 0) return shape;
    PyObject *now_object = values[1], *task_ids = values[4], *worker = values[5];
    long long now, lease_seconds;
    if (!small_int(now_object, 0, &now) || !small_int(values[0], 1, &lease_seconds)
        || lease_seconds > LLONG_MAX - now || !plain_name(worker, self->max_name)
        || !PyList_CheckExact(task_ids) || PyList_GET_SIZE(task_ids) == 0
        || PyList_GET_SIZE(task_ids) > MAX_TARGETS)
        return DECLINE;
    Py_ssize_t count = PyList_GET_SIZE(task_ids);
    PyObject *targets[MAX_TARGETS];
    PyObject *previous_id = NULL;
    long long previous_time = 0;
    for (Py_ssize_t i = 0; i < count; i++) {   /* _listed_tasks and _check_due */
        PyObject *task_id = PyList_GET_ITEM(task_ids, i);
        if (!PyUnicode_CheckExact(task_id)) return DECLINE;
        PyObject *task = PyDict_GetItemWithError(self->tasks, task_id);
        if (task == NULL) return PyErr_Occurred() ? FAILED : DECLINE;   /* unknown or completed */
        PyObject *status = PyObject_GetAttr(task, s_status);
        if (status == NULL) return FAILED;
        int ready = same_str(status, self->READY);
        Py_DECREF(status);
        long long time;
        if (ready < 0 || task_int(task, s_available_at, &time) < 0) return FAILED;
        if (!ready || time > now) return DECLINE;
        if (previous_id != NULL) {
            if (time < previous_time) return DECLINE;
            if (time == previous_time) {
                int after = PyUnicode_Compare(task_id, previous_id);
                if (after == -1 && PyErr_Occurred()) return FAILED;
                if (after <= 0) return DECLINE;   /* out of order, or listed twice */
            }
        }
        previous_id = task_id;
        previous_time = time;
        targets[i] = task;
    }
    /* (time, task_id) strictly ascending: no id is listed twice, as _listed_tasks requires. */
    if (mode == CHECK) return DONE;
    long long deadline = now + lease_seconds;
    long long per_task = self->reserve_base + digits(deadline) + json_name_bytes(worker);
    if (add_growth(self, count * per_task) < 0) return FAILED;

    PyObject *deadline_object = PyLong_FromLongLong(deadline);
    if (deadline_object == NULL) return FAILED;
    int result = FAILED;
    for (Py_ssize_t i = 0; i < count; i++) {   /* State._commit_reserve */
        PyObject *task = targets[i];
        Py_INCREF(task);
        PyObject *task_id = PyObject_GetAttr(task, s_task_id);
        long long attempts, generation;
        int ok = task_id != NULL
            && PyObject_SetAttr(task, s_status, self->LEASED) == 0
            && call_void(self->ready_discard, &task_id, 1) == 0
            && call_void(self->leased_add, &task_id, 1) == 0
            && task_int(task, s_attempts, &attempts) == 0
            && set_int(task, s_attempts, attempts + 1) == 0
            && task_int(task, s_generation, &generation) == 0
            && set_int(task, s_generation, generation + 1) == 0
            && PyObject_SetAttr(task, s_worker, worker) == 0
            && PyObject_SetAttr(task, s_deadline, deadline_object) == 0
            && PyObject_SetAttr(task, s_lease_start, now_object) == 0
            && push(self, self->lease_heap, deadline_object, task_id) == 0
            && call_void(self->lease_started, &task, 1) == 0;
        Py_XDECREF(task_id);
        Py_DECREF(task);
        if (!ok) goto done;
    }
    if (counts_add(self, self->READY, -count) < 0 || counts_add(self, self->LEASED, count) < 0
        || tidy(self, self->lease_heap, self->LEASED, 0) < 0)
        goto done;
    long long leased;
    if (count_of(self, self->LEASED, &leased) < 0) goto done;
    PyObject *leased_object = PyLong_FromLongLong(leased);
    if (leased_object == NULL) goto done;
    PyObject *args[2] = {self->tasks, leased_object};
    int halved = call_void(self->tidy_halves, args, 2);
    Py_DECREF(leased_object);
    if (halved == 0) result = DONE;
done:
    Py_DECREF(deadline_object);
    return result;
}

/* -------------------------------------------------------------------- ack */

static PyObject **ack_fields[6] = {&s_generation, &s_now, &s_op, &s_seq, &s_task_id, &s_worker};

static int ack(Applier *self, PyObject *record, int mode)
{
    PyObject *values[6];
    int shape = has_fields(record, ack_fields, 6, values);
    if (shape <= 0) return shape;
    PyObject *task_id = values[4], *worker = values[5];
    long long generation, now;
    if (!plain_name(task_id, self->max_name) || !plain_name(worker, self->max_name)
        || !small_int(values[0], 0, &generation) || !small_int(values[1], 0, &now))
        return DECLINE;
    PyObject *task = PyDict_GetItemWithError(self->tasks, task_id);   /* State._current_lease */
    if (task == NULL) return PyErr_Occurred() ? FAILED : DECLINE;
    Py_INCREF(task);
    int result = FAILED;
    PyObject *status = NULL, *leaser = NULL, *identity = NULL, *id = NULL, *key = NULL;
    PyObject *payload = NULL, *available_at = NULL, *max_attempts = NULL, *attempts = NULL,
        *task_generation = NULL;
    long long current_generation, deadline;
    if ((status = PyObject_GetAttr(task, s_status)) == NULL) goto done;
    int leased = same_str(status, self->LEASED);
    if (leased < 0) goto done;
    if (!leased) goto declined;
    if (task_int(task, s_generation, &current_generation) < 0) goto done;
    if (current_generation != generation) goto declined;
    if ((leaser = PyObject_GetAttr(task, s_worker)) == NULL) goto done;
    int same = same_str(leaser, worker);
    if (same < 0) goto done;
    if (!same) goto declined;
    if (task_int(task, s_deadline, &deadline) < 0) goto done;
    if (!(now < deadline)) goto declined;
    if (mode == CHECK) {
        result = DONE;
        goto done;
    }

    if (add_growth(self, self->ack_base - digits(deadline) - PyUnicode_GET_LENGTH(leaser)) < 0)
        goto done;
    /* State._commit_ack */
    if ((id = PyObject_GetAttr(task, s_task_id)) == NULL
        || (key = PyObject_GetAttr(task, s_key)) == NULL
        || (identity = PyObject_GetAttr(task, s_identity)) == NULL
        || (payload = PyObject_GetAttr(task, s_payload)) == NULL
        || (available_at = PyObject_GetAttr(task, s_available_at)) == NULL
        || (max_attempts = PyObject_GetAttr(task, s_max_attempts)) == NULL
        || (attempts = PyObject_GetAttr(task, s_attempts)) == NULL
        || (task_generation = PyObject_GetAttr(task, s_generation)) == NULL)
        goto done;
    PyObject *digest;
    if (identity == Py_None) {
        PyObject *args[4] = {id, payload, available_at, max_attempts};
        digest = PyObject_Vectorcall(self->identity_digest, args, 4, NULL);
    } else {
        digest = PyObject_CallOneArg(self->fromhex, identity);
    }
    if (digest == NULL) goto done;
    Py_SETREF(identity, digest);
    PyObject *tomb_args[7] = {id, key, identity, attempts, max_attempts, task_generation,
                              available_at};
    if (call_void(self->lease_ended, &id, 1) < 0
        || PyDict_DelItem(self->tasks, id) < 0
        || PyDict_DelItem(self->task_id_by_key, key) < 0
        || call_void(self->leased_discard, &id, 1) < 0
        || call_void(self->tomb_add, tomb_args, 7) < 0
        || counts_add(self, self->LEASED, -1) < 0
        || counts_add(self, self->COMPLETED, 1) < 0)
        goto done;
    result = DONE;
    goto done;
declined:
    result = PyErr_Occurred() ? FAILED : DECLINE;
done:
    Py_XDECREF(status);
    Py_XDECREF(leaser);
    Py_XDECREF(identity);
    Py_XDECREF(id);
    Py_XDECREF(key);
    Py_XDECREF(payload);
    Py_XDECREF(available_at);
    Py_XDECREF(max_attempts);
    Py_XDECREF(attempts);
    Py_XDECREF(task_generation);
    Py_DECREF(task);
    return result;
}

/* ---------------------------------------------------------------- the type */

/* State.check's record-level test, then the op's own; DECLINE leaves all to the reference. */
static int apply_fast(Applier *self, PyObject *record, PyObject *body_bytes, int mode)
{
    if (!PyDict_CheckExact(record)) return DECLINE;
    PyObject *op = PyDict_GetItemWithError(record, s_op);
    PyObject *seq = PyDict_GetItemWithError(record, s_seq);
    if (op == NULL || seq == NULL || !PyUnicode_CheckExact(op))
        return PyErr_Occurred() ? FAILED : DECLINE;
    long long number, last_seq;
    if (!small_int(seq, 1, &number)) return DECLINE;
    if (task_int(self->state, s_last_seq, &last_seq) < 0) return FAILED;
    if (number != last_seq + 1) return DECLINE;
    int result;
    int is_put = same_str(op, s_put), is_reserve = 0, is_ack = 0;
    if (is_put < 0) return FAILED;
    if (is_put) {
        if (PyDict_GET_SIZE(record) != 3) return DECLINE;   /* op, seq, tasks */
        result = put(self, record, seq, body_bytes, mode);
    } else if ((is_reserve = same_str(op, s_reserve)) > 0) {
        result = reserve(self, record, mode);
    } else if (is_reserve == 0 && (is_ack = same_str(op, s_ack)) > 0) {
        result = ack(self, record, mode);
    } else {
        return (is_reserve < 0 || is_ack < 0) ? FAILED : DECLINE;
    }
    if (result != DONE || mode == CHECK) return result;
    return PyObject_SetAttr(self->state, s_last_seq, seq) < 0 ? FAILED : DONE;
}

static PyObject *applier_call(Applier *self, PyObject *args, PyObject *kwargs)
{
    PyObject *record, *body_bytes = Py_None;
    static char *keywords[] = {"record", "body_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:Applier", keywords, &record, &body_bytes))
        return NULL;
    int result = apply_fast(self, record, body_bytes, APPLY);
    if (result == FAILED) return NULL;
    if (result == DONE) {
        self->applied++;
        Py_RETURN_NONE;
    }
    self->declined++;
    PyObject *call_args[2] = {record, body_bytes};
    return PyObject_Vectorcall(self->fallback, call_args, 2, NULL);
}

/* The writer's pair, State.check and State.commit: check(record) returns the change to commit,
 * which is the record itself when the twin decides it (remembered until the next check), or
 * else whatever state.check returns (it raises the reference's error for a rejected record);
 * commit(change, body_bytes) commits either. */
static PyObject *applier_check(Applier *self, PyObject *record)
{
    int result = apply_fast(self, record, Py_None, CHECK);
    if (result == FAILED) return NULL;
    Py_CLEAR(self->checked);
    if (result == DECLINE) return PyObject_CallOneArg(self->fallback_check, record);
    self->checked = Py_NewRef(record);
    return Py_NewRef(record);
}

static PyObject *applier_commit(Applier *self, PyObject *const *args, Py_ssize_t count)
{
    if (count != 2) {
        PyErr_SetString(PyExc_TypeError, "Applier.commit(change, body_bytes) takes 2 arguments");
        return NULL;
    }
    PyObject *change = args[0];
    if (self->checked == NULL || change != self->checked) {
        self->declined++;
        return PyObject_Vectorcall(self->fallback_commit, args, 2, NULL);
    }
    PyObject *record = self->checked;
    self->checked = NULL;
    int result = apply_fast(self, record, args[1], COMMIT);
    Py_DECREF(record);
    if (result == FAILED) return NULL;
    if (result == DECLINE) {   /* a bug: nothing may change between check and commit */
        PyErr_SetString(PyExc_SystemError, "Applier.commit: the record no longer passes the "
                                           "checks it passed in Applier.check");
        return NULL;
    }
    self->applied++;
    Py_RETURN_NONE;
}

static PyMethodDef applier_methods[] = {
    {"check", (PyCFunction)applier_check, METH_O,
     "check(record): State.check; the change is the record itself when decided here."},
    {"commit", (PyCFunction)(void (*)(void))applier_commit, METH_FASTCALL,
     "commit(change, body_bytes): State.commit of a change check returned."},
    {NULL},
};

static void applier_dealloc(Applier *self)
{
    PyObject **fields[] = {
        &self->state, &self->fallback, &self->fallback_check, &self->fallback_commit,
        &self->checked, &self->task_type, &self->identity_digest, &self->fromhex,
        &self->heappush, &self->tasks, &self->task_id_by_key, &self->counts, &self->ready_heap,
        &self->lease_heap, &self->tomb_contains, &self->tomb_has_key, &self->tomb_add,
        &self->ready_add, &self->ready_discard, &self->leased_add, &self->leased_discard,
        &self->became_ready, &self->lease_started, &self->lease_ended, &self->tidy_ready,
        &self->tidy_halves, &self->tidy, &self->READY, &self->LEASED, &self->COMPLETED};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) Py_CLEAR(*fields[i]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *attribute(PyObject *object, const char *path)   /* "a.b.c" of object, new ref */
{
    char name[64];
    Py_INCREF(object);
    while (*path) {
        size_t size = strcspn(path, ".");
        if (size >= sizeof name) {
            Py_DECREF(object);
            PyErr_SetString(PyExc_ValueError, "attribute name too long");
            return NULL;
        }
        memcpy(name, path, size);
        name[size] = '\0';
        PyObject *next = PyObject_GetAttrString(object, name);
        Py_DECREF(object);
        if (next == NULL) return NULL;
        object = next;
        path += size + (path[size] == '.');
    }
    return object;
}

static PyObject *applier_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *state, *task_type, *identity_digest, *fromhex, *heappush, *statuses;
    long long put_extra, reserve_base, ack_base, max_int;
    Py_ssize_t max_name, max_reserve;
    static char *keywords[] = {"state", "task_type", "identity_digest", "fromhex", "heappush",
                               "statuses", "put_extra", "reserve_base", "ack_base", "max_name",
                               "max_reserve", "max_int", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO!LLLnnL:Applier", keywords, &state,
                                     &task_type, &identity_digest, &fromhex, &heappush,
                                     &PyTuple_Type, &statuses, &put_extra, &reserve_base,
                                     &ack_base, &max_name, &max_reserve, &max_int))
        return NULL;
    if (PyTuple_GET_SIZE(statuses) != 3 || max_reserve != MAX_TARGETS || max_int != LLONG_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "Applier: statuses must be (ready, leased, completed), max_reserve 1000 "
                        "and max_int 2**63 - 1, as this code was written for");
        return NULL;
    }
    Applier *self = (Applier *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->state = Py_NewRef(state);
    self->task_type = Py_NewRef(task_type);
    self->identity_digest = Py_NewRef(identity_digest);
    self->fromhex = Py_NewRef(fromhex);
    self->heappush = Py_NewRef(heappush);
    self->READY = Py_NewRef(PyTuple_GET_ITEM(statuses, 0));
    self->LEASED = Py_NewRef(PyTuple_GET_ITEM(statuses, 1));
    self->COMPLETED = Py_NewRef(PyTuple_GET_ITEM(statuses, 2));
    self->put_extra = put_extra;
    self->reserve_base = reserve_base;
    self->ack_base = ack_base;
    self->max_name = max_name;
    struct { PyObject **slot; const char *path; } bound[] = {
        {&self->fallback, "apply"}, {&self->fallback_check, "check"},
        {&self->fallback_commit, "commit"}, {&self->tasks, "tasks"},
        {&self->task_id_by_key, "task_id_by_key"}, {&self->counts, "counts"},
        {&self->ready_heap, "_ready"}, {&self->lease_heap, "_leases"},
        {&self->tomb_contains, "tombstones.__contains__"}, {&self->tomb_has_key, "tombstones.has_key"},
        {&self->tomb_add, "tombstones.add"}, {&self->ready_add, "live_index.ready.add"},
        {&self->ready_discard, "live_index.ready.discard"},
        {&self->leased_add, "live_index.leased.add"},
        {&self->leased_discard, "live_index.leased.discard"},
        {&self->became_ready, "monitoring.became_ready"},
        {&self->lease_started, "monitoring.lease_started"},
        {&self->lease_ended, "monitoring.lease_ended"},
        {&self->tidy_ready, "monitoring.tidy_ready"},
        {&self->tidy_halves, "monitoring.tidy_halves"}, {&self->tidy, "_tidy"}};
    for (size_t i = 0; i < sizeof bound / sizeof bound[0]; i++) {
        if ((*bound[i].slot = attribute(state, bound[i].path)) == NULL) {
            Py_DECREF(self);
            return NULL;
        }
    }
    if (!PyDict_CheckExact(self->tasks) || !PyDict_CheckExact(self->task_id_by_key)
        || !PyDict_CheckExact(self->counts) || !PyList_CheckExact(self->ready_heap)
        || !PyList_CheckExact(self->lease_heap)) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_TypeError, "Applier: the state's tasks, counts and heaps must be "
                                         "a dict and lists, as State makes them");
        return NULL;
    }
    return (PyObject *)self;
}

static PyMemberDef applier_members[] = {
    {"applied", Py_T_LONGLONG, offsetof(Applier, applied), Py_READONLY,
     "records applied here"},
    {"declined", Py_T_LONGLONG, offsetof(Applier, declined), Py_READONLY,
     "records left to state.apply"},
    {NULL},
};

static PyTypeObject ApplierType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "walqueue._speedups.Applier",
    .tp_basicsize = sizeof(Applier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Applier(state, ...)(record, body_bytes=None): State.apply, put/reserve/ack in C.",
    .tp_new = applier_new,
    .tp_dealloc = (destructor)applier_dealloc,
    .tp_call = (ternaryfunc)applier_call,
    .tp_members = applier_members,
    .tp_methods = applier_methods,
};

int add_applier(PyObject *module)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_op, "op"}, {&s_seq, "seq"}, {&s_tasks, "tasks"}, {&s_task_id, "task_id"},
        {&s_key, "key"}, {&s_available_at, "available_at"}, {&s_max_attempts, "max_attempts"},
        {&s_payload, "payload"}, {&s_now, "now"}, {&s_lease_seconds, "lease_seconds"},
        {&s_task_ids, "task_ids"}, {&s_worker, "worker"}, {&s_generation, "generation"},
        {&s_put, "put"}, {&s_reserve, "reserve"}, {&s_ack, "ack"}, {&s_status, "status"},
        {&s_attempts, "attempts"}, {&s_deadline, "deadline"}, {&s_lease_start, "lease_start"},
        {&s_identity, "identity"}, {&s_last_seq, "last_seq"},
        {&s_snapshot_growth, "snapshot_growth"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    if (PyType_Ready(&ApplierType) < 0) return -1;
    return PyModule_AddObjectRef(module, "Applier", (PyObject *)&ApplierType);
}
