/* walqueue._speedups.block_find, block_search and index_find: the lookups of the tombstone
 * store (walqueue/tombstones.py, _Block.find, _Block.search and _Index.find) in C.
 *
 * Every put asks the tombstone store whether its id and key are taken, and every ack adds a
 * tombstone at its rank in name order, so these run on the request path and in replay, once
 * or more per record, and in Python they were a loop of bytearray slices. The reference is
 * the Python method of the same name: same arguments (the block, a name as bytes), same
 * answer; tests/unit/test_tombstones.py compares the two on random blocks, forced hash
 * collisions included. Names compare as Python's bytes do: memcmp, then the shorter first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

int add_tombstone_lookups(PyObject *module);

static PyObject *s_names, *s_name_bounds, *s_hashes, *s_hashed, *s_order, *s_blocks, *s_firsts,
    *s_last;

typedef struct {
    const unsigned char *names;
    const uint32_t *bounds;
    Py_ssize_t count;   /* names in the block: len(bounds) - 1 */
} Names;

/* A uint32 column of the block (array('I')), or NULL buffer for None when `optional`. */
static int column(PyObject *block, PyObject *name, Py_buffer *view, int optional)
{
    PyObject *value = PyObject_GetAttr(block, name);
    if (value == NULL) return -1;
    if (value == Py_None && optional) {
        Py_DECREF(value);
        view->obj = NULL;
        view->buf = NULL;
        view->len = 0;
        return 0;
    }
    int got = PyObject_GetBuffer(value, view, PyBUF_FORMAT | PyBUF_ND);
    Py_DECREF(value);
    if (got < 0) return -1;
    if (view->itemsize != 4) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "tombstone block column %U must be array('I')", name);
        return -1;
    }
    return 0;
}

static int open_names(PyObject *block, Py_buffer *names, Py_buffer *bounds, Names *out)
{
    PyObject *value = PyObject_GetAttr(block, s_names);
    if (value == NULL) return -1;
    int got = PyObject_GetBuffer(value, names, PyBUF_SIMPLE);
    Py_DECREF(value);
    if (got < 0) return -1;
    if (column(block, s_name_bounds, bounds, 0) < 0) {
        PyBuffer_Release(names);
        return -1;
    }
    out->names = names->buf;
    out->bounds = bounds->buf;
    out->count = bounds->len / 4 - 1;
    return 0;
}

/* name `index` of the block against `name`: <0, 0, >0 as bytes compare. */
static int compare(const Names *block, Py_ssize_t index, const char *name, Py_ssize_t size)
{
    uint32_t start = block->bounds[index], end = block->bounds[index + 1];
    Py_ssize_t length = (Py_ssize_t)(end - start);
    int order = memcmp(block->names + start, name, (size_t)(length < size ? length : size));
    if (order != 0) return order;
    return length < size ? -1 : length > size;
}

/* The arrival index of `name` in `block`, -1 if it is not there, -2 with an error. */
static long find_in_block(PyObject *block, PyObject *name)
{
    Py_hash_t full = PyObject_Hash(name);   /* hash(name) & 0xFFFFFFFF, as _Block.find */
    if (full == -1 && PyErr_Occurred()) return -2;
    uint32_t key = (uint32_t)((uint64_t)full & 0xFFFFFFFFu);
    Py_buffer names, bounds, hashes, hashed;
    Names view;
    if (open_names(block, &names, &bounds, &view) < 0) return -2;
    long found = -1;
    int failed = column(block, s_hashes, &hashes, 0) < 0;
    if (!failed && column(block, s_hashed, &hashed, 0) < 0) {
        PyBuffer_Release(&hashes);
        failed = 1;
    }
    if (!failed) {
        const uint32_t *keys = hashes.buf, *arrivals = hashed.buf;
        Py_ssize_t count = hashes.len / 4, low = 0, high = count;
        while (low < high) {   /* bisect_left */
            Py_ssize_t middle = (low + high) / 2;
            if (keys[middle] < key) low = middle + 1; else high = middle;
        }
        const char *text = PyBytes_AS_STRING(name);
        Py_ssize_t size = PyBytes_GET_SIZE(name);
        for (; low < count && keys[low] == key; low++) {
            if (compare(&view, arrivals[low], text, size) == 0) {
                found = (long)arrivals[low];
                break;
            }
        }
        PyBuffer_Release(&hashes);
        PyBuffer_Release(&hashed);
    }
    PyBuffer_Release(&names);
    PyBuffer_Release(&bounds);
    return failed ? -2 : found;
}

static PyObject *block_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "block_find(block, name: bytes)");
        return NULL;
    }
    long found = find_in_block(args[0], args[1]);
    return found == -2 ? NULL : PyLong_FromLong(found);
}

/* bytes a against bytes b: <0, 0, >0, as Python compares them. */
static int compare_bytes(PyObject *a, PyObject *b)
{
    Py_ssize_t left = PyBytes_GET_SIZE(a), right = PyBytes_GET_SIZE(b);
    int order = memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b),
                       (size_t)(left < right ? left : right));
    if (order != 0) return order;
    return left < right ? -1 : left > right;
}

static PyObject *index_find(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "index_find(index, name: bytes)");
        return NULL;
    }
    PyObject *index = args[0], *name = args[1];
    PyObject *blocks = PyObject_GetAttr(index, s_blocks), *firsts = NULL, *last = NULL;
    PyObject *result = NULL;
    if (blocks == NULL) return NULL;
    if ((firsts = PyObject_GetAttr(index, s_firsts)) == NULL
        || (last = PyObject_GetAttr(index, s_last)) == NULL)
        goto done;
    if (!PyList_CheckExact(blocks) || !PyList_CheckExact(firsts) || !PyBytes_CheckExact(last)
        || PyList_GET_SIZE(firsts) != PyList_GET_SIZE(blocks)) {
        PyErr_SetString(PyExc_TypeError, "index_find: an _Index's blocks, firsts and last");
        goto done;
    }
    if (PyList_GET_SIZE(blocks) == 0 || compare_bytes(name, last) > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t low = 0, high = PyList_GET_SIZE(firsts);
    while (low < high) {   /* bisect_right(firsts, name) */
        Py_ssize_t middle = (low + high) / 2;
        PyObject *first = PyList_GET_ITEM(firsts, middle);
        if (!PyBytes_CheckExact(first)) {
            PyErr_SetString(PyExc_TypeError, "index_find: a first name that is not bytes");
            goto done;
        }
        if (compare_bytes(name, first) < 0) high = middle; else low = middle + 1;
    }
    PyObject *block = PyList_GET_ITEM(blocks, low > 0 ? low - 1 : 0);
    long found = find_in_block(block, name);
    if (found == -2) goto done;
    result = found < 0 ? Py_NewRef(Py_None) : Py_BuildValue("(Ol)", block, found);
done:
    Py_DECREF(blocks);
    Py_XDECREF(firsts);
    Py_XDECREF(last);
    return result;
}

static PyObject *block_search(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "block_search(block, name: bytes)");
        return NULL;
    }
    PyObject *block = args[0], *name = args[1];
    Py_buffer names, bounds, order;
    Names view;
    if (open_names(block, &names, &bounds, &view) < 0) return NULL;
    if (column(block, s_order, &order, 1) < 0) {
        PyBuffer_Release(&names);
        PyBuffer_Release(&bounds);
        return NULL;
    }
    const uint32_t *ranks = order.buf;   /* NULL: arrival order is name order */
    const char *text = PyBytes_AS_STRING(name);
    Py_ssize_t size = PyBytes_GET_SIZE(name), low = 0, high = view.count;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        Py_ssize_t index = ranks == NULL ? middle : (Py_ssize_t)ranks[middle];
        if (compare(&view, index, text, size) < 0) low = middle + 1; else high = middle;
    }
    long found = -1;
    if (low < view.count) {
        Py_ssize_t index = ranks == NULL ? low : (Py_ssize_t)ranks[low];
        if (compare(&view, index, text, size) == 0) found = (long)index;
    }
    if (order.obj != NULL) PyBuffer_Release(&order);
    PyBuffer_Release(&names);
    PyBuffer_Release(&bounds);
    return Py_BuildValue("(nl)", low, found);
}

static PyMethodDef lookups[] = {
    {"block_find", (PyCFunction)(void (*)(void))block_find, METH_FASTCALL,
     "block_find(block, name): tombstones._Block.find, the arrival index of name or -1."},
    {"index_find", (PyCFunction)(void (*)(void))index_find, METH_FASTCALL,
     "index_find(index, name): tombstones._Index.find, (block, arrival index) or None."},
    {"block_search", (PyCFunction)(void (*)(void))block_search, METH_FASTCALL,
     "block_search(block, name): tombstones._Block.search, (rank, arrival index or -1)."},
    {NULL},
};

int add_tombstone_lookups(PyObject *module)
{
    struct { PyObject **slot; const char *text; } names[] = {
        {&s_names, "names"}, {&s_name_bounds, "name_bounds"}, {&s_hashes, "hashes"},
        {&s_hashed, "hashed"}, {&s_order, "order"}, {&s_blocks, "blocks"}, {&s_firsts, "firsts"},
        {&s_last, "last"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) return -1;
    return PyModule_AddFunctions(module, lookups);
}
