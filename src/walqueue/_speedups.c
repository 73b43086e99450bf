/* walqueue._speedups: the compiled twin of the per-item hot paths (issue 22).
 *
 * The pure-Python modules (codec, snapshot, tombstones, state) are the reference;
 * walqueue.speedups decides which path runs. Every function here either
 * gives exactly the result the reference gives, or declines ("defer") and
 * leaves that item to the reference, which then raises its own error: this
 * module never rejects anything itself, so what is rejected, with which class
 * and offset, is always the reference's answer. tests/unit/test_speedups.py
 * and scripts/speedups_differential.py compare the two paths.
 *
 *   sha256(buffer) / sha256_portable(buffer)   SHA-256 (x86 SHA extensions when the CPU has them)
 *   scan(data, start, stop_at_entry, max_frames, frame_type)
 *       -> (frames, offset, code)              the frame walk of codec.scan_frames
 *   load_tombstones(data, offset, limit, last_id, taken)
 *       -> None | (offset, count, names, bounds, identities, numbers, wide, hashes, hashed)
 *                                              snapshot tombstone entries, as one block's columns
 *   tombstone_frames(names, name_bounds, values, value_bounds, identities, numbers, order, count)
 *       -> bytes                               the snapshot frames of one tombstone block
 *   Applier(state, ...)(record, body_bytes)    State.apply, put/reserve/ack in C (_apply.c),
 *       .check(record), .commit(change, body_bytes)   and State.check/commit, for the writer
 *   block_find(block, name), block_search(block, name)
 *                                              tombstones._Block's lookups (_tombstones.c)
 *
 * Standard C99 plus CPython's API; the SHA extensions path only on x86-64 with GCC or clang.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

int add_applier(PyObject *module);   /* _apply.c: adds the Applier type; -1 with an error */
int add_tombstone_lookups(PyObject *module);   /* _tombstones.c: block_find, block_search */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHA_NI 1
#include <cpuid.h>
#include <immintrin.h>
#endif

/* hash(bytes): the store's hash column (tombstones._Block.hashes) holds Python's own. */
#if PY_VERSION_HEX >= 0x030E0000
#define hash_bytes Py_HashBuffer
#else
#if PY_VERSION_HEX >= 0x030D0000
PyAPI_FUNC(Py_hash_t) _Py_HashBytes(const void *, Py_ssize_t);   /* exported, header internal */
#endif
#define hash_bytes _Py_HashBytes
#endif

#define MAX_FRAME_BYTES (16u * 1024u * 1024u)
#define LENGTH_BYTES 4
#define DIGEST_BYTES 32
#define BLOCK_TOMBSTONES 512
#define IDENTITY_BYTES 32
#define MAX_DEPTH 64           /* deeper JSON is left to the reference */

/* ---------------------------------------------------------------- SHA-256 */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H256[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_blocks_portable(uint32_t state[8], const unsigned char *data, size_t blocks)
{
    uint32_t w[64];
    while (blocks--) {
        for (int t = 0; t < 16; t++) {
            const unsigned char *p = data + 4 * t;
            w[t] = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
        }
        for (int t = 16; t < 64; t++) {
            uint32_t s0 = ROTR(w[t - 15], 7) ^ ROTR(w[t - 15], 18) ^ (w[t - 15] >> 3);
            uint32_t s1 = ROTR(w[t - 2], 17) ^ ROTR(w[t - 2], 19) ^ (w[t - 2] >> 10);
            w[t] = w[t - 16] + s0 + w[t - 7] + s1;
        }
        uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
        uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
        for (int t = 0; t < 64; t++) {
            uint32_t t1 = h + (ROTR(e, 6) ^ ROTR(e, 11) ^ ROTR(e, 25)) + ((e & f) ^ (~e & g))
                          + K256[t] + w[t];
            uint32_t t2 = (ROTR(a, 2) ^ ROTR(a, 13) ^ ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        state[0] += a; state[1] += b; state[2] += c; state[3] += d;
        state[4] += e; state[5] += f; state[6] += g; state[7] += h;
        data += 64;
    }
}

#ifdef HAVE_SHA_NI
/* The SHA extensions (Intel SDM, "SHA extensions"): two rounds per sha256rnds2, the
 * state kept as ABEF/CDGH, the message schedule by sha256msg1/msg2. */
__attribute__((target("sha,sse4.1,ssse3")))
static void sha256_blocks_ni(uint32_t state[8], const unsigned char *data, size_t blocks)
{
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&state[0]);     /* DCBA */
    __m128i state1 = _mm_loadu_si128((const __m128i *)&state[4]);  /* HGFE */
    tmp = _mm_shuffle_epi32(tmp, 0xB1);                              /* CDAB */
    state1 = _mm_shuffle_epi32(state1, 0x1B);                        /* EFGH */
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);                /* ABEF */
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);                     /* CDGH */
    while (blocks--) {
        __m128i abef = state0, cdgh = state1, w[4], msg;
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * i)), byteswap);
        for (int i = 0; i < 16; i++) {
            msg = _mm_add_epi32(w[i & 3], _mm_loadu_si128((const __m128i *)&K256[4 * i]));
            state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
            if (i < 12) {
                /* w[i+4] = msg2(msg1(w[i], w[i+1]) + w[i+2..i+3] shifted by one word, w[i+3]) */
                __m128i next = _mm_sha256msg1_epu32(w[i & 3], w[(i + 1) & 3]);
                next = _mm_add_epi32(next, _mm_alignr_epi8(w[(i + 3) & 3], w[(i + 2) & 3], 4));
                w[i & 3] = _mm_sha256msg2_epu32(next, w[(i + 3) & 3]);
            }
            msg = _mm_shuffle_epi32(msg, 0x0E);
            state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
        }
        state0 = _mm_add_epi32(state0, abef);
        state1 = _mm_add_epi32(state1, cdgh);
        data += 64;
    }
    tmp = _mm_shuffle_epi32(state0, 0x1B);                           /* FEBA */
    state1 = _mm_shuffle_epi32(state1, 0xB1);                        /* DCHG */
    state0 = _mm_blend_epi16(tmp, state1, 0xF0);                     /* DCBA */
    state1 = _mm_alignr_epi8(state1, tmp, 8);                        /* HGFE */
    _mm_storeu_si128((__m128i *)&state[0], state0);
    _mm_storeu_si128((__m128i *)&state[4], state1);
}

static int cpu_has_sha_ni(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    if (!(c & (1u << 19)) || !(c & (1u << 9)))   /* SSE4.1, SSSE3 */
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b & (1u << 29)) != 0;                 /* SHA */
}
#endif

typedef void (*blocks_fn)(uint32_t *, const unsigned char *, size_t);
static blocks_fn sha256_blocks = sha256_blocks_portable;

static void sha256_with(blocks_fn blocks, const unsigned char *data, size_t size, unsigned char out[32])
{
    uint32_t state[8];
    unsigned char last[128];
    memcpy(state, H256, sizeof state);
    size_t whole = size / 64;
    if (whole)
        blocks(state, data, whole);
    size_t rest = size - whole * 64;
    memset(last, 0, sizeof last);
    memcpy(last, data + whole * 64, rest);
    last[rest] = 0x80;
    size_t tail = rest < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)size * 8;
    for (int i = 0; i < 8; i++)
        last[tail - 1 - i] = (unsigned char)(bits >> (8 * i));
    blocks(state, last, tail / 64);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(state[i] >> 8);
        out[4 * i + 3] = (unsigned char)state[i];
    }
}

static void sha256(const unsigned char *data, size_t size, unsigned char out[32])
{
    sha256_with(sha256_blocks, data, size, out);
}

static PyObject *digest_of(PyObject *arg, blocks_fn blocks)
{
    Py_buffer view;
    unsigned char out[32];
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    sha256_with(blocks, view.buf, (size_t)view.len, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyObject *py_sha256(PyObject *self, PyObject *arg) { return digest_of(arg, sha256_blocks); }
static PyObject *py_sha256_portable(PyObject *self, PyObject *arg)
{
    return digest_of(arg, sha256_blocks_portable);
}

/* ------------------------------------------------------- canonical JSON */

/* A parser of exactly the canonical JSON codec.canonical_json writes (sorted keys, no
 * whitespace, ensure_ascii=False escapes, Python's float repr). Anything else -- which
 * the reference may accept or reject -- is "deferred": the parse returns NULL with no
 * exception set, and the caller leaves the frame to the reference. */

typedef struct {
    const unsigned char *p, *end;
    int depth;
    char *scratch;          /* unescaped string bytes */
    Py_ssize_t scratch_size;
} Parser;

static PyObject *parse_value(Parser *ps);

/* The value of a lowercase hex digit, -1 for any other byte (canonical hex is lowercase). */
static signed char HEX[256];

static void init_hex(void)
{
    memset(HEX, -1, sizeof HEX);
    for (int c = '0'; c <= '9'; c++) HEX[c] = (signed char)(c - '0');
    for (int c = 'a'; c <= 'f'; c++) HEX[c] = (signed char)(c - 'a' + 10);
}

static inline int hexval(unsigned char c) { return HEX[c]; }

/* Parse a string at ps->p (on its opening quote). On success returns the str and, when
 * `raw`/`raw_size` are given, the unescaped UTF-8 bytes (valid until the next call). */
static PyObject *parse_string(Parser *ps, const char **raw, Py_ssize_t *raw_size)
{
    const unsigned char *p = ps->p + 1, *end = ps->end, *start = p;
    int escaped = 0;
    while (p < end && *p != '"') {
        if (*p < 0x20) return NULL;
        if (*p == '\\') { escaped = 1; p += 2; continue; }
        p++;
    }
    if (p >= end) return NULL;
    const char *text = (const char *)start;
    Py_ssize_t size = p - start;
    if (escaped) {
        if (ps->scratch_size < size) {
            char *bigger = PyMem_Realloc(ps->scratch, size);
            if (bigger == NULL) { PyErr_NoMemory(); return NULL; }
            ps->scratch = bigger;
            ps->scratch_size = size;
        }
        char *out = ps->scratch;
        Py_ssize_t n = 0;
        for (const unsigned char *q = start; q < p; q++) {
            if (*q != '\\') { out[n++] = (char)*q; continue; }
            q++;
            switch (*q) {
            case '"': out[n++] = '"'; break;
            case '\\': out[n++] = '\\'; break;
            case 'n': out[n++] = '\n'; break;
            case 'r': out[n++] = '\r'; break;
            case 't': out[n++] = '\t'; break;
            case 'b': out[n++] = '\b'; break;
            case 'f': out[n++] = '\f'; break;
            case 'u': {
                if (p - q < 5 || q[1] != '0' || q[2] != '0') return NULL;
                int high = hexval(q[3]), low = hexval(q[4]);
                if (high < 0 || low < 0) return NULL;
                int code = high * 16 + low;
                /* canonical only below 0x20 and where no short escape exists */
                if (code >= 0x20 || code == '\n' || code == '\r' || code == '\t' || code == '\b'
                    || code == '\f')
                    return NULL;
                out[n++] = (char)code;
                q += 4;
                break;
            }
            default: return NULL;
            }
        }
        text = out;
        size = n;
    }
    PyObject *value = PyUnicode_DecodeUTF8(text, size, "strict");
    if (value == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();   /* defer */
        return NULL;
    }
    ps->p = p + 1;
    if (raw != NULL) { *raw = text; *raw_size = size; }
    return value;
}

static PyObject *parse_number(Parser *ps)
{
    const unsigned char *p = ps->p, *end = ps->end, *start = p;
    int is_float = 0;
    if (p < end && *p == '-') p++;
    if (p >= end || *p < '0' || *p > '9') return NULL;
    if (*p == '0') {
        p++;
        if (p < end && *p >= '0' && *p <= '9') return NULL;
    } else {
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    Py_ssize_t size = p - start;
    char buffer[64];
    if (size >= (Py_ssize_t)sizeof buffer) return NULL;
    memcpy(buffer, start, size);
    buffer[size] = '\0';
    if (!is_float) {
        int negative = buffer[0] == '-';
        if (size - negative > 18) return NULL;               /* big ints: the reference */
        if (negative && size == 2 && buffer[1] == '0') return NULL;   /* -0 reads as 0 */
        long long value = strtoll(buffer, NULL, 10);
        ps->p = p;
        return PyLong_FromLongLong(value);
    }
    char *stop;
    double value = PyOS_string_to_double(buffer, &stop, NULL);
    if (value == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    if (stop != buffer + size || !isfinite(value)) return NULL;
    char *repr = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (repr == NULL) return NULL;
    int same = strcmp(repr, buffer) == 0;
    PyMem_Free(repr);
    if (!same) return NULL;
    ps->p = p;
    return PyFloat_FromDouble(value);
}

static PyObject *parse_object(Parser *ps)
{
    if (++ps->depth > MAX_DEPTH) return NULL;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    ps->p++;   /* { */
    if (ps->p < ps->end && *ps->p == '}') { ps->p++; ps->depth--; return dict; }
    char *previous = NULL;
    Py_ssize_t previous_size = 0;
    for (;;) {
        if (ps->p >= ps->end || *ps->p != '"') goto defer;
        const char *raw;
        Py_ssize_t raw_size;
        PyObject *key = parse_string(ps, &raw, &raw_size);
        if (key == NULL) goto defer;
        /* keys strictly ascending by code point = by their UTF-8 bytes */
        if (previous != NULL) {
            Py_ssize_t common = raw_size < previous_size ? raw_size : previous_size;
            int order = memcmp(raw, previous, common);
            if (order < 0 || (order == 0 && raw_size <= previous_size)) { Py_DECREF(key); goto defer; }
        }
        char *copy = PyMem_Realloc(previous, raw_size ? raw_size : 1);
        if (copy == NULL) { Py_DECREF(key); PyErr_NoMemory(); goto defer; }
        previous = copy;
        memcpy(previous, raw, raw_size);
        previous_size = raw_size;
        if (ps->p >= ps->end || *ps->p != ':') { Py_DECREF(key); goto defer; }
        ps->p++;
        PyObject *value = parse_value(ps);
        if (value == NULL) { Py_DECREF(key); goto defer; }
        int failed = PyDict_SetItem(dict, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (failed) goto defer;
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == '}') { ps->p++; break; }
        goto defer;
    }
    PyMem_Free(previous);
    ps->depth--;
    return dict;
defer:
    PyMem_Free(previous);
    Py_DECREF(dict);
    return NULL;
}

static PyObject *parse_array(Parser *ps)
{
    if (++ps->depth > MAX_DEPTH) return NULL;
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    ps->p++;   /* [ */
    if (ps->p < ps->end && *ps->p == ']') { ps->p++; ps->depth--; return list; }
    for (;;) {
        PyObject *value = parse_value(ps);
        if (value == NULL) goto defer;
        int failed = PyList_Append(list, value);
        Py_DECREF(value);
        if (failed) goto defer;
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == ']') { ps->p++; break; }
        goto defer;
    }
    ps->depth--;
    return list;
defer:
    Py_DECREF(list);
    return NULL;
}

static int literal(Parser *ps, const char *word, size_t size)
{
    if ((size_t)(ps->end - ps->p) < size || memcmp(ps->p, word, size) != 0) return 0;
    ps->p += size;
    return 1;
}

static PyObject *parse_value(Parser *ps)
{
    if (ps->p >= ps->end) return NULL;
    switch (*ps->p) {
    case '{': return parse_object(ps);
    case '[': return parse_array(ps);
    case '"': return parse_string(ps, NULL, NULL);
    case 't': if (literal(ps, "true", 4)) Py_RETURN_TRUE; return NULL;
    case 'f': if (literal(ps, "false", 5)) Py_RETURN_FALSE; return NULL;
    case 'n': if (literal(ps, "null", 4)) Py_RETURN_NONE; return NULL;
    default: return parse_number(ps);
    }
}

/* The object a canonical body holds, or NULL (deferred if no exception is set). */
static PyObject *parse_body(const unsigned char *body, Py_ssize_t size, Parser *ps)
{
    if (size == 0 || body[0] != '{') return NULL;
    ps->p = body;
    ps->end = body + size;
    ps->depth = 0;
    PyObject *value = parse_object(ps);
    if (value != NULL && ps->p != ps->end) { Py_DECREF(value); return NULL; }
    return value;
}

/* ------------------------------------------------------ tombstone entries */

/* tombstones.ENTRY, by hand: the canonical entry of a completed task whose id and key are
 * printable ASCII with no quote or backslash. */
typedef struct {
    unsigned long long numbers[4];   /* attempts, available_at, generation, max_attempts */
    int overflow;                    /* a number of 2**63 or more (the regex still matches) */
    const unsigned char *identity;   /* 64 hex digits */
    const unsigned char *key, *task_id;
    Py_ssize_t key_size, task_id_size;
} Entry;

static int expect(const unsigned char **p, const unsigned char *end, const char *text, size_t size)
{
    if ((size_t)(end - *p) < size || memcmp(*p, text, size) != 0) return 0;
    *p += size;
    return 1;
}

static int match_integer(const unsigned char **p, const unsigned char *end, unsigned long long *out,
                         int *overflow)
{
    const unsigned char *q = *p;
    if (q >= end || *q < '0' || *q > '9') return 0;
    if (*q == '0') { *out = 0; *p = q + 1; return 1; }
    unsigned long long value = 0;
    int digits = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        if (++digits > 19) return 0;
        value = value * 10 + (unsigned long long)(*q - '0');
        q++;
    }
    if (value > (unsigned long long)INT64_MAX) *overflow = 1;
    *out = value;
    *p = q;
    return 1;
}

static int match_name(const unsigned char **p, const unsigned char *end, const unsigned char **name,
                      Py_ssize_t *size)
{
    const unsigned char *q = *p;
    if (q >= end || *q != '"') return 0;
    const unsigned char *start = ++q;
    while (q < end && *q != '"') {
        if (*q < 0x20 || *q > 0x7e || *q == '\\') return 0;
        q++;
    }
    if (q >= end || q == start || q - start > 1024) return 0;
    *name = start;
    *size = q - start;
    *p = q + 1;
    return 1;
}

#define EXPECT(text) if (!expect(&p, end, text, sizeof(text) - 1)) return 0

static int match_entry(const unsigned char *p, Py_ssize_t size, Entry *entry)
{
    const unsigned char *end = p + size;
    entry->overflow = 0;
    EXPECT("{\"attempts\":");
    if (!match_integer(&p, end, &entry->numbers[0], &entry->overflow)) return 0;
    EXPECT(",\"available_at\":");
    if (!match_integer(&p, end, &entry->numbers[1], &entry->overflow)) return 0;
    EXPECT(",\"deadline\":null,\"generation\":");
    if (!match_integer(&p, end, &entry->numbers[2], &entry->overflow)) return 0;
    EXPECT(",\"identity\":\"");
    if (end - p < 64) return 0;
    for (int i = 0; i < 64; i++)
        if (hexval(p[i]) < 0) return 0;
    entry->identity = p;
    p += 64;
    EXPECT("\",\"key\":");
    if (!match_name(&p, end, &entry->key, &entry->key_size)) return 0;
    EXPECT(",\"max_attempts\":");
    if (!match_integer(&p, end, &entry->numbers[3], &entry->overflow)) return 0;
    EXPECT(",\"payload\":null,\"status\":\"completed\",\"task_id\":");
    if (!match_name(&p, end, &entry->task_id, &entry->task_id_size)) return 0;
    EXPECT(",\"worker\":null}");
    return p == end;
}

/* A complete frame with a good digest at `offset`: its body and length, else 0. */
static int good_frame(const unsigned char *data, Py_ssize_t size, Py_ssize_t offset,
                      const unsigned char **body, Py_ssize_t *length)
{
    if (size - offset < LENGTH_BYTES) return 0;
    const unsigned char *p = data + offset;
    uint32_t n = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    if (n == 0 || n > MAX_FRAME_BYTES || (Py_ssize_t)n + LENGTH_BYTES + DIGEST_BYTES > size - offset)
        return 0;
    unsigned char digest[32];
    sha256(p + LENGTH_BYTES, n, digest);
    if (memcmp(digest, p + LENGTH_BYTES + n, DIGEST_BYTES) != 0) return 0;
    *body = p + LENGTH_BYTES;
    *length = n;
    return 1;
}

/* ------------------------------------------------------------------ scan */

enum { SCAN_LIMIT = 0, SCAN_END = 1, SCAN_ENTRY = 2, SCAN_DEFER = 3 };

static PyObject *py_scan(PyObject *self, PyObject *args)
{
    PyObject *data_object, *frame_type;
    Py_ssize_t offset, max_frames;
    int stop_at_entry;
    if (!PyArg_ParseTuple(args, "OnpnO", &data_object, &offset, &stop_at_entry, &max_frames,
                          &frame_type))
        return NULL;
    if (!PyType_Check(frame_type) || !PyType_IsSubtype((PyTypeObject *)frame_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "frame_type must be a tuple subclass");
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)frame_type;
    Py_buffer view;
    if (PyObject_GetBuffer(data_object, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t size = view.len;
    Parser ps = {0};
    Entry entry;
    int code = SCAN_LIMIT;
    PyObject *frames = PyList_New(0);
    if (frames == NULL) goto error;
    if (offset < 0 || offset > size) { code = SCAN_DEFER; goto done; }
    while (PyList_GET_SIZE(frames) < max_frames) {
        if (offset == size) { code = SCAN_END; break; }
        const unsigned char *body;
        Py_ssize_t length;
        if (!good_frame(data, size, offset, &body, &length)) { code = SCAN_DEFER; break; }
        if (stop_at_entry && match_entry(body, length, &entry)) { code = SCAN_ENTRY; break; }
        PyObject *value = parse_body(body, length, &ps);
        if (value == NULL) {
            if (PyErr_Occurred()) goto error;
            code = SCAN_DEFER;
            break;
        }
        Py_ssize_t end = offset + LENGTH_BYTES + length + DIGEST_BYTES;
        PyObject *frame = type->tp_alloc(type, 3);
        PyObject *start_number = PyLong_FromSsize_t(offset), *end_number = PyLong_FromSsize_t(end);
        if (frame == NULL || start_number == NULL || end_number == NULL) {
            Py_XDECREF(frame); Py_XDECREF(start_number); Py_XDECREF(end_number); Py_DECREF(value);
            goto error;
        }
        PyTuple_SET_ITEM(frame, 0, start_number);
        PyTuple_SET_ITEM(frame, 1, end_number);
        PyTuple_SET_ITEM(frame, 2, value);
        int failed = PyList_Append(frames, frame);
        Py_DECREF(frame);
        if (failed) goto error;
        offset = end;
    }
done:
    PyMem_Free(ps.scratch);
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nni)", frames, offset, code);
error:
    PyMem_Free(ps.scratch);
    Py_XDECREF(frames);
    PyBuffer_Release(&view);
    return NULL;
}

/* -------------------------------------------------------- tombstone load */

typedef struct { uint32_t hash, index; } Hashed;

/* Sort by (hash, index): a stable radix sort on the hash, of entries already in index
 * order, so equal hashes keep their index order. `spare` holds `count` more. (glibc's qsort
 * was a tenth of a restart: a merge sort with a malloc per block and a call per compare.) */
static void sort_by_hash(Hashed *hashes, Hashed *spare, Py_ssize_t count)
{
    Hashed *from = hashes, *to = spare;
    for (int shift = 0; shift < 32; shift += 8) {
        Py_ssize_t starts[257] = {0};
        for (Py_ssize_t i = 0; i < count; i++) starts[((from[i].hash >> shift) & 0xFF) + 1]++;
        for (int b = 0; b < 256; b++) starts[b + 1] += starts[b];
        for (Py_ssize_t i = 0; i < count; i++) to[starts[(from[i].hash >> shift) & 0xFF]++] = from[i];
        Hashed *swap = from; from = to; to = swap;
    }
    /* Four passes: the result is back in `hashes`. */
}

static PyObject *py_load_tombstones(PyObject *self, PyObject *args)
{
    PyObject *data_object, *taken;
    Py_ssize_t offset, limit;
    const char *last_id;
    Py_ssize_t last_size;
    if (!PyArg_ParseTuple(args, "Onny#O", &data_object, &offset, &limit, &last_id, &last_size, &taken))
        return NULL;
    if (taken != Py_None && !PyDict_Check(taken)) {
        PyErr_SetString(PyExc_TypeError, "taken must be a dict or None");
        return NULL;
    }
    if (limit > BLOCK_TOMBSTONES) limit = BLOCK_TOMBSTONES;
    Py_buffer view;
    if (PyObject_GetBuffer(data_object, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t size = view.len;
    PyObject *result = NULL;
    char *names = NULL;
    uint32_t *bounds = NULL;
    unsigned char *identities = NULL;
    unsigned long long *numbers = NULL;
    Hashed *hashes = NULL;
    names = PyMem_Malloc((size_t)limit * 1024 + 1);
    bounds = PyMem_Malloc(sizeof(uint32_t) * (size_t)(limit + 1));
    identities = PyMem_Malloc((size_t)limit * IDENTITY_BYTES + 1);
    numbers = PyMem_Malloc(sizeof(unsigned long long) * 4 * (size_t)limit + 1);
    hashes = PyMem_Malloc(sizeof(Hashed) * 2 * (size_t)limit + 1);   /* and sort_by_hash's spare */
    if (!names || !bounds || !identities || !numbers || !hashes) { PyErr_NoMemory(); goto out; }
    Py_ssize_t count = 0, used = 0;
    const unsigned char *previous = (const unsigned char *)last_id;
    Py_ssize_t previous_size = last_size;
    int wide = 0;
    bounds[0] = 0;
    if (offset < 0) offset = size;
    while (count < limit) {
        const unsigned char *body;
        Py_ssize_t length;
        Entry entry;
        if (!good_frame(data, size, offset, &body, &length) || !match_entry(body, length, &entry))
            break;
        /* The rules State.load_plain_tombstones checks; a frame breaking one is left to it. */
        unsigned long long attempts = entry.numbers[0], available_at = entry.numbers[1];
        unsigned long long generation = entry.numbers[2], max_attempts = entry.numbers[3];
        if (entry.overflow || attempts < 1 || attempts > max_attempts || attempts > generation)
            break;
        if (entry.key_size != entry.task_id_size
            || memcmp(entry.key, entry.task_id, entry.key_size) != 0)
            break;
        Py_ssize_t common = entry.task_id_size < previous_size ? entry.task_id_size : previous_size;
        int order = memcmp(entry.task_id, previous, common);
        if (order < 0 || (order == 0 && entry.task_id_size <= previous_size))
            break;
        if (taken != Py_None) {
            PyObject *name = PyUnicode_DecodeASCII((const char *)entry.task_id, entry.task_id_size, NULL);
            if (name == NULL) goto out;
            int found = PyDict_Contains(taken, name);
            Py_DECREF(name);
            if (found < 0) goto out;
            if (found) break;
        }
        memcpy(names + used, entry.task_id, entry.task_id_size);
        previous = (const unsigned char *)names + used;
        previous_size = entry.task_id_size;
        Py_hash_t hash = hash_bytes(previous, previous_size);
        hashes[count].hash = (uint32_t)((uint64_t)hash & 0xFFFFFFFFu);
        hashes[count].index = (uint32_t)count;
        used += entry.task_id_size;
        bounds[count + 1] = (uint32_t)used;
        for (int i = 0; i < IDENTITY_BYTES; i++)
            identities[IDENTITY_BYTES * count + i] =
                (unsigned char)(hexval(entry.identity[2 * i]) * 16 + hexval(entry.identity[2 * i + 1]));
        unsigned long long *row = numbers + 4 * count;
        row[0] = attempts; row[1] = max_attempts; row[2] = generation; row[3] = available_at;
        for (int i = 0; i < 4; i++)
            if (row[i] > 0xFFFFFFFFull) wide = 1;
        count++;
        offset += LENGTH_BYTES + length + DIGEST_BYTES;
    }
    if (count == 0) { result = Py_None; Py_INCREF(result); goto out; }
    sort_by_hash(hashes, hashes + limit, count);
    PyObject *number_bytes;
    if (wide) {
        int64_t *packed = PyMem_Malloc(sizeof(int64_t) * 4 * (size_t)count);
        if (packed == NULL) { PyErr_NoMemory(); goto out; }
        for (Py_ssize_t i = 0; i < 4 * count; i++) packed[i] = (int64_t)numbers[i];
        number_bytes = PyBytes_FromStringAndSize((const char *)packed, sizeof(int64_t) * 4 * count);
        PyMem_Free(packed);
    } else {
        uint32_t *packed = PyMem_Malloc(sizeof(uint32_t) * 4 * (size_t)count);
        if (packed == NULL) { PyErr_NoMemory(); goto out; }
        for (Py_ssize_t i = 0; i < 4 * count; i++) packed[i] = (uint32_t)numbers[i];
        number_bytes = PyBytes_FromStringAndSize((const char *)packed, sizeof(uint32_t) * 4 * count);
        PyMem_Free(packed);
    }
    if (number_bytes == NULL) goto out;
    uint32_t *hash_column = PyMem_Malloc(sizeof(uint32_t) * 2 * (size_t)count);
    if (hash_column == NULL) { Py_DECREF(number_bytes); PyErr_NoMemory(); goto out; }
    for (Py_ssize_t i = 0; i < count; i++) {
        hash_column[i] = hashes[i].hash;
        hash_column[count + i] = hashes[i].index;
    }
    result = Py_BuildValue("(nny#y#y#Niy#y#)", offset, count,
                           names, used,
                           (const char *)bounds, (Py_ssize_t)(sizeof(uint32_t) * (count + 1)),
                           (const char *)identities, (Py_ssize_t)(IDENTITY_BYTES * count),
                           number_bytes, wide,
                           (const char *)hash_column, (Py_ssize_t)(sizeof(uint32_t) * count),
                           (const char *)(hash_column + count), (Py_ssize_t)(sizeof(uint32_t) * count));
    PyMem_Free(hash_column);
out:
    PyMem_Free(names);
    PyMem_Free(bounds);
    PyMem_Free(identities);
    PyMem_Free(numbers);
    PyMem_Free(hashes);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------ tombstone frames */

typedef struct { char *buf; Py_ssize_t size, capacity; } Out;

static int reserve(Out *out, Py_ssize_t more)
{
    if (out->size + more <= out->capacity) return 0;
    Py_ssize_t capacity = out->capacity ? out->capacity : 4096;
    while (capacity < out->size + more) capacity *= 2;
    char *bigger = PyMem_Realloc(out->buf, capacity);
    if (bigger == NULL) { PyErr_NoMemory(); return -1; }
    out->buf = bigger;
    out->capacity = capacity;
    return 0;
}

static void put(Out *out, const char *text, Py_ssize_t size)
{
    memcpy(out->buf + out->size, text, size);
    out->size += size;
}

#define PUT(text) put(out, text, sizeof(text) - 1)

static char HEX_PAIRS[256][2];   /* "00" to "ff", filled at import */

static void fill_hex_pairs(void)
{
    static const char hex[] = "0123456789abcdef";
    for (int c = 0; c < 256; c++) { HEX_PAIRS[c][0] = hex[c >> 4]; HEX_PAIRS[c][1] = hex[c & 15]; }
}

/* A JSON string as canonical_json writes it (ensure_ascii=False): the worst case is 6
 * bytes per input byte plus the quotes, reserved by the caller. */
static void put_string(Out *out, const unsigned char *text, Py_ssize_t size)
{
    static const char hex[] = "0123456789abcdef";
    out->buf[out->size++] = '"';
    /* The common case, a name with nothing to escape, in one copy. */
    Py_ssize_t plain = 0;
    while (plain < size && text[plain] >= 0x20 && text[plain] != '"' && text[plain] != '\\') plain++;
    put(out, (const char *)text, plain);
    for (Py_ssize_t i = plain; i < size; i++) {
        unsigned char c = text[i];
        if (c >= 0x20 && c != '"' && c != '\\') { out->buf[out->size++] = (char)c; continue; }
        out->buf[out->size++] = '\\';
        switch (c) {
        case '"': out->buf[out->size++] = '"'; break;
        case '\\': out->buf[out->size++] = '\\'; break;
        case '\n': out->buf[out->size++] = 'n'; break;
        case '\r': out->buf[out->size++] = 'r'; break;
        case '\t': out->buf[out->size++] = 't'; break;
        case '\b': out->buf[out->size++] = 'b'; break;
        case '\f': out->buf[out->size++] = 'f'; break;
        default:
            put(out, "u00", 3);
            out->buf[out->size++] = hex[c >> 4];
            out->buf[out->size++] = hex[c & 15];
        }
    }
    out->buf[out->size++] = '"';
}

/* The decimal digits of a number, as %lld writes them (snprintf was a third of the time
 * of a tombstone's frame). */
static void put_number(Out *out, long long value)
{
    char text[24];
    int size = 0;
    unsigned long long magnitude = value < 0 ? 0ull - (unsigned long long)value : (unsigned long long)value;
    if (magnitude < 10) {
        if (value < 0) out->buf[out->size++] = '-';
        out->buf[out->size++] = (char)('0' + magnitude);
        return;
    }
    do {
        text[sizeof text - 1 - size++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0) text[sizeof text - 1 - size++] = '-';
    put(out, text + sizeof text - size, size);
}

static int get_view(PyObject *object, Py_buffer *view, int format)
{
    if (object == Py_None) { view->obj = NULL; view->buf = NULL; view->len = 0; view->itemsize = 1; return 0; }
    return PyObject_GetBuffer(object, view, format ? PyBUF_FORMAT | PyBUF_ND : PyBUF_SIMPLE);
}

static long long item(Py_buffer *view, Py_ssize_t index)
{
    if (view->itemsize == 8) return ((const int64_t *)view->buf)[index];
    return ((const uint32_t *)view->buf)[index];
}

static PyObject *py_tombstone_frames(PyObject *self, PyObject *args)
{
    PyObject *objects[7];
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "OOOOOOOn", &objects[0], &objects[1], &objects[2], &objects[3],
                          &objects[4], &objects[5], &objects[6], &count))
        return NULL;
    /* names, name_bounds, values, value_bounds, identities, numbers, order */
    static const int typed[7] = {0, 1, 0, 1, 0, 1, 1};
    Py_buffer views[7];
    int got = 0;
    PyObject *result = NULL;
    Out out = {0};
    for (; got < 7; got++)
        if (get_view(objects[got], &views[got], typed[got]) < 0) goto done;
    Py_buffer *names = &views[0], *name_bounds = &views[1], *values = &views[2];
    Py_buffer *value_bounds = &views[3], *identities = &views[4], *numbers = &views[5];
    Py_buffer *order = &views[6];
    for (int i = 1; i < 7; i += 2)
        if (i != 5 && views[i].obj != NULL && views[i].itemsize != 4) {
            PyErr_SetString(PyExc_TypeError, "bounds and order must be array('I')");
            goto done;
        }
    if (numbers->itemsize != 4 && numbers->itemsize != 8) {
        PyErr_SetString(PyExc_TypeError, "numbers must be array('I') or array('q')");
        goto done;
    }
    Py_ssize_t total = name_bounds->len / 4 - 1;
    if (count < 0 || count > total || identities->len < IDENTITY_BYTES * total
        || numbers->len / numbers->itemsize < 4 * total
        || (value_bounds->obj != NULL && value_bounds->len / 4 < total + 1)) {
        PyErr_SetString(PyExc_ValueError, "columns shorter than the count");
        goto done;
    }
    const unsigned char *name_bytes = names->buf, *value_bytes = values->buf, *identity = identities->buf;
    Py_ssize_t taken = 0, position = 0, limit = order->obj != NULL ? order->len / 4 : count;
    while (taken < count && position < limit) {
        Py_ssize_t index = order->obj != NULL ? (Py_ssize_t)((const uint32_t *)order->buf)[position] : position;
        position++;
        if (index >= count) continue;   /* arrived after the store was frozen */
        taken++;
        uint32_t name_start = ((const uint32_t *)name_bounds->buf)[index];
        uint32_t name_end = ((const uint32_t *)name_bounds->buf)[index + 1];
        const unsigned char *key = name_bytes + name_start;
        Py_ssize_t key_size = name_end - name_start;
        if (value_bounds->obj != NULL) {
            uint32_t value_start = ((const uint32_t *)value_bounds->buf)[index];
            uint32_t value_end = ((const uint32_t *)value_bounds->buf)[index + 1];
            if (value_end > value_start) { key = value_bytes + value_start; key_size = value_end - value_start; }
        }
        Py_ssize_t name_size = name_end - name_start;
        if (reserve(&out, 400 + 6 * (name_size + key_size) + 4 + 32) < 0) goto done;
        Py_ssize_t frame_start = out.size;
        out.size += LENGTH_BYTES;
        long long attempts = item(numbers, 4 * index), max_attempts = item(numbers, 4 * index + 1);
        long long generation = item(numbers, 4 * index + 2), available_at = item(numbers, 4 * index + 3);
        Out *o = &out;
        #define OUT_PUT(text) put(o, text, sizeof(text) - 1)
        OUT_PUT("{\"attempts\":");
        put_number(o, attempts);
        OUT_PUT(",\"available_at\":");
        put_number(o, available_at);
        OUT_PUT(",\"deadline\":null,\"generation\":");
        put_number(o, generation);
        OUT_PUT(",\"identity\":\"");
        const unsigned char *digest = identity + IDENTITY_BYTES * index;
        for (int i = 0; i < IDENTITY_BYTES; i++) {   /* two hex digits a byte, by table */
            memcpy(o->buf + o->size, HEX_PAIRS[digest[i]], 2);
            o->size += 2;
        }
        OUT_PUT("\",\"key\":");
        put_string(o, key, key_size);
        OUT_PUT(",\"max_attempts\":");
        put_number(o, max_attempts);
        OUT_PUT(",\"payload\":null,\"status\":\"completed\",\"task_id\":");
        put_string(o, name_bytes + name_start, name_size);
        OUT_PUT(",\"worker\":null}");
        #undef OUT_PUT
        Py_ssize_t body_size = out.size - frame_start - LENGTH_BYTES;
        unsigned char *frame = (unsigned char *)out.buf + frame_start;
        frame[0] = (unsigned char)(body_size >> 24);
        frame[1] = (unsigned char)(body_size >> 16);
        frame[2] = (unsigned char)(body_size >> 8);
        frame[3] = (unsigned char)body_size;
        sha256(frame + LENGTH_BYTES, body_size, (unsigned char *)out.buf + out.size);
        out.size += DIGEST_BYTES;
    }
    result = PyBytes_FromStringAndSize(out.buf ? out.buf : "", out.size);
done:
    for (int i = 0; i < got; i++)
        if (views[i].obj != NULL) PyBuffer_Release(&views[i]);
    PyMem_Free(out.buf);
    return result;
}

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"sha256", py_sha256, METH_O, "SHA-256 digest of a buffer (the fastest implementation here)."},
    {"sha256_portable", py_sha256_portable, METH_O, "SHA-256 digest by the portable C code."},
    {"scan", py_scan, METH_VARARGS,
     "scan(data, start, stop_at_entry, max_frames, frame_type) -> (frames, offset, code)"},
    {"load_tombstones", py_load_tombstones, METH_VARARGS,
     "load_tombstones(data, offset, limit, last_id, taken) -> None or a block's columns"},
    {"tombstone_frames", py_tombstone_frames, METH_VARARGS,
     "tombstone_frames(names, name_bounds, values, value_bounds, identities, numbers, order, count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "walqueue._speedups",
    "The compiled twin of walqueue's per-item hot paths (see walqueue.speedups).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void)
{
    const char *sha = "portable";
    init_hex();
    fill_hex_pairs();
#ifdef HAVE_SHA_NI
    if (cpu_has_sha_ni()) {
        sha256_blocks = sha256_blocks_ni;
        sha = "x86-sha";
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "SHA256_IMPLEMENTATION", sha) < 0
        || PyModule_AddIntConstant(m, "SCAN_LIMIT", SCAN_LIMIT) < 0
        || PyModule_AddIntConstant(m, "SCAN_END", SCAN_END) < 0
        || PyModule_AddIntConstant(m, "SCAN_ENTRY", SCAN_ENTRY) < 0
        || PyModule_AddIntConstant(m, "SCAN_DEFER", SCAN_DEFER) < 0
        || add_applier(m) < 0 || add_tombstone_lookups(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
