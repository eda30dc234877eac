/* chute._native: CRC32C (Castagnoli) for chute's record formats.
 *
 * An optional extension (setup.py builds it with optional=True); without it chute uses
 * the `crc32c` package through `chute/_src/records/checksum.py`, which decides.
 *
 *   crc32c(data, value=0, /) -> int
 *       The CRC32C of a C-contiguous bytes-like object, continuing from `value` (the CRC
 *       of what came before), like `crc32c.crc32c` of the crc32c package.
 *   crc32c_portable(data, value=0, /) -> int
 *       The same through the table-driven code only (to test it on any CPU).
 *   read_checked(buffer, offset, length, crc, /) -> bytes | None
 *       bytes(buffer[offset:offset + length]) if their CRC32C is `crc`, else None.
 *   HARDWARE: bool
 *       Whether `crc32c` uses the CPU's CRC32 instruction (x86-64 with SSE4.2, found at
 *       import time); otherwise it runs the table-driven code.
 *
 * The table-driven code processes 8 bytes per step (eight 256-entry tables). The SSE4.2
 * code runs three independent CRC streams over three lanes of a block (the instruction
 * has a latency of three cycles and a throughput of one per cycle) and joins them with
 * a table that multiplies a CRC by x^(8 * LANE) modulo the polynomial, which is what
 * appending LANE zero bytes does to it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#define CHUTE_HAVE_SSE42 1
#include <nmmintrin.h>
#else
#define CHUTE_HAVE_SSE42 0
#endif

#define POLY 0x82F63B78u /* CRC32C, bit-reflected */
#define LANE 1024        /* bytes per stream in a block of three */
/* Calls over more bytes than this release the GIL while they run (about 50 us or less). */
#define NOGIL_MIN (1 << 20)

static uint32_t table[8][256];
static uint32_t shift_lane[4][256]; /* r -> r * x^(8 * LANE) mod P, a byte of r at a time */
static int hardware;

static uint32_t
crc_table(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^
              table[4][lo >> 24] ^ table[3][hi & 0xff] ^ table[2][(hi >> 8) & 0xff] ^
              table[1][(hi >> 16) & 0xff] ^ table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    }
    return crc;
}

static uint32_t
shift(uint32_t crc)
{
    return shift_lane[0][crc & 0xff] ^ shift_lane[1][(crc >> 8) & 0xff] ^
           shift_lane[2][(crc >> 16) & 0xff] ^ shift_lane[3][crc >> 24];
}

static void
init_tables(void)
{
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) {
            c = (c >> 1) ^ (POLY & (0u - (c & 1)));
        }
        table[0][b] = c;
    }
    for (int t = 1; t < 8; t++) {
        for (int b = 0; b < 256; b++) {
            uint32_t c = table[t - 1][b];
            table[t][b] = table[0][c & 0xff] ^ (c >> 8);
        }
    }
    /* Shifting is linear in the CRC's bits: find where each bit goes, then combine. */
    static const unsigned char zeros[LANE];
    uint32_t column[32];
    for (int bit = 0; bit < 32; bit++) {
        column[bit] = crc_table((uint32_t)1 << bit, zeros, LANE);
    }
    for (int byte = 0; byte < 4; byte++) {
        for (int v = 0; v < 256; v++) {
            uint32_t c = 0;
            for (int bit = 0; bit < 8; bit++) {
                if (v & (1 << bit)) {
                    c ^= column[8 * byte + bit];
                }
            }
            shift_lane[byte][v] = c;
        }
    }
}

#if CHUTE_HAVE_SSE42
__attribute__((target("sse4.2"))) static uint32_t
crc_sse42(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    uint64_t c0 = crc;
    while (n >= 3 * LANE) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + LANE;
        do {
            uint64_t w0, w1, w2;
            memcpy(&w0, p, 8);
            memcpy(&w1, p + LANE, 8);
            memcpy(&w2, p + 2 * LANE, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        c0 = shift(shift((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 2 * LANE;
        n -= 3 * LANE;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c0;
    while (n--) {
        crc = _mm_crc32_u8(crc, *p++);
    }
    return crc;
}
#endif

static inline uint32_t
crc_best(uint32_t crc, const unsigned char *p, size_t n)
{
#if CHUTE_HAVE_SSE42
    if (hardware) {
        return crc_sse42(crc, p, n);
    }
#endif
    return crc_table(crc, p, n);
}

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);

static int
parse_value(PyObject *arg, const char *what, uint32_t *out)
{
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError) ||
            PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s=%R is not a CRC32C: it must be an int in [0, 2**32)", what, arg);
        }
        return -1;
    }
    if (v > 0xFFFFFFFFul) {
        PyErr_Format(PyExc_ValueError, "%s=%R is not a CRC32C: it must be an int in [0, 2**32)",
                     what, arg);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static PyObject *
crc_call(PyObject *const *args, Py_ssize_t nargs, const char *name, crc_fn fn)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "%s(data, value=0, /) takes 1 or 2 arguments (%zd given)",
                     name, nargs);
        return NULL;
    }
    uint32_t value = 0;
    if (nargs == 2 &&
        parse_value(args[1], "crc32c: value (the CRC of the data before)", &value) < 0) {
        return NULL;
    }
    PyObject *data = args[0];
    uint32_t crc;
    if (PyBytes_CheckExact(data)) {
        /* The caller holds a reference, and bytes never change: no buffer export needed. */
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(data);
        if (n >= NOGIL_MIN) {
            Py_BEGIN_ALLOW_THREADS
            crc = ~fn(~value, p, (size_t)n);
            Py_END_ALLOW_THREADS
        }
        else {
            crc = ~fn(~value, p, (size_t)n);
        }
    }
    else {
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            return NULL;
        }
        const unsigned char *p = (const unsigned char *)view.buf;
        size_t n = (size_t)view.len;
        if (view.len >= NOGIL_MIN) {
            Py_BEGIN_ALLOW_THREADS
            crc = ~fn(~value, p, n);
            Py_END_ALLOW_THREADS
        }
        else {
            crc = ~fn(~value, p, n);
        }
        PyBuffer_Release(&view);
    }
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *
native_crc32c(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return crc_call(args, nargs, "crc32c", crc_best);
}

static PyObject *
native_crc32c_portable(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return crc_call(args, nargs, "crc32c_portable", crc_table);
}

static PyObject *
native_read_checked(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError,
                     "read_checked(buffer, offset, length, crc, /) takes 4 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[2]);
    if (length == -1 && PyErr_Occurred()) {
        return NULL;
    }
    uint32_t expected;
    if (parse_value(args[3], "read_checked: crc", &expected) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (offset < 0 || length < 0 || offset > view.len || length > view.len - offset) {
        PyErr_Format(PyExc_ValueError,
                     "read_checked: bytes [%zd, %zd + %zd) are not inside the buffer of %zd "
                     "bytes; offset and length must be >= 0 and end inside it",
                     offset, offset, length, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    /* The GIL stays held: the buffer may be a mapped file, which chute's file guard lets
     * shrink only after the read in flight had the GIL back (see _file_guard.py). */
    const unsigned char *p = (const unsigned char *)view.buf + offset;
    PyObject *out = NULL;
    if (~crc_best(0xFFFFFFFFu, p, (size_t)length) == expected) {
        out = PyBytes_FromStringAndSize((const char *)p, length);
    }
    else {
        out = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"crc32c", (PyCFunction)(void (*)(void))native_crc32c, METH_FASTCALL,
     "crc32c(data, value=0, /)\n--\n\n"
     "The CRC32C of the bytes-like `data`, continuing from `value`."},
    {"crc32c_portable", (PyCFunction)(void (*)(void))native_crc32c_portable, METH_FASTCALL,
     "crc32c_portable(data, value=0, /)\n--\n\n"
     "`crc32c` through the table-driven code, whatever the CPU."},
    {"read_checked", (PyCFunction)(void (*)(void))native_read_checked, METH_FASTCALL,
     "read_checked(buffer, offset, length, crc, /)\n--\n\n"
     "bytes(buffer[offset:offset + length]) if their CRC32C is `crc`, else None."},
    {NULL, NULL, 0, NULL},
};

static int
native_exec(PyObject *module)
{
    init_tables();
#if CHUTE_HAVE_SSE42
    __builtin_cpu_init();
    hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#else
    hardware = 0;
#endif
    return PyModule_AddObjectRef(module, "HARDWARE", hardware ? Py_True : Py_False);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, native_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "chute._native",
    .m_doc = "CRC32C for chute's record formats (see chute/_src/records/checksum.py).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&module_def);
}
