/*
 * _pgrow.h: what the C modules that read raw pgoutput row changes share (the emitters'
 * formatters, emitters/_jsonrow.c, _textrow.c, _wal2jsonrow.c, and the row filter's
 * plugin_framework/rowfilter/native/_rawfilter.c): an output buffer, and the reading of a
 * pgoutput TupleData straight from a message's bytes.
 *
 * Static functions only: each extension module includes its own copy.
 */

#ifndef PGDECODE_PGROW_H
#define PGDECODE_PGROW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pgoutput_tags.h" /* generated from plugin_framework/protocol/tags.py */

/* What a formatting step tells its caller: go on, hand the message to Python, or a Python
 * error (out of memory, or an exception that is not an Exception) is set. */
#define OK 0
#define DEFER 1
#define FAIL (-1)

/* --- an output buffer: on the stack for most lines, on the heap past that ----------------- */

typedef struct {
    char *p;
    size_t len, cap;
    char stack[4096];
} Buf;

static void buf_init(Buf *b) {
    b->p = b->stack;
    b->len = 0;
    b->cap = sizeof b->stack;
}

static void buf_free(Buf *b) {
    if (b->p != b->stack)
        PyMem_Free(b->p);
}

static int buf_grow(Buf *b, size_t need) {
    size_t cap = b->cap;
    while (cap < b->len + need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return FAIL;
        }
        cap *= 2;
    }
    char *p;
    if (b->p == b->stack) {
        p = PyMem_Malloc(cap);
        if (p != NULL)
            memcpy(p, b->stack, b->len);
    } else {
        p = PyMem_Realloc(b->p, cap);
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return FAIL;
    }
    b->p = p;
    b->cap = cap;
    return OK;
}

static inline int put(Buf *b, const void *s, size_t n) {
    if (b->len + n > b->cap && buf_grow(b, n) < 0)
        return FAIL;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return OK;
}

static inline int put_byte(Buf *b, char c) {
    if (b->len + 1 > b->cap && buf_grow(b, 1) < 0)
        return FAIL;
    b->p[b->len++] = c;
    return OK;
}

#define PUT_LITERAL(b, s) put((b), (s), sizeof(s) - 1)
#define TRY(expr)                                                                             \
    do {                                                                                      \
        int rc_ = (expr);                                                                     \
        if (rc_ != OK)                                                                        \
            return rc_;                                                                       \
    } while (0)

/* --- a pgoutput TupleData ---------------------------------------------------------------- */

/* One column of a tuple as the message carries it. */
typedef struct {
    unsigned char kind; /* PGOUTPUT_TUPLE_NULL, _UNCHANGED_TOAST or _TEXT */
    const unsigned char *value;
    size_t len;
} Column;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A TupleData at *p of exactly ncols text, null and unchanged-TOAST columns; NULL for
 * anything else (binary columns, malformed data). */
static const unsigned char *read_tuple(const unsigned char *p, const unsigned char *end,
                                       Py_ssize_t ncols, Column *cols) {
    if (end - p < 2 || (Py_ssize_t)(((unsigned)p[0] << 8) | p[1]) != ncols)
        return NULL;
    p += 2;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (p == end)
            return NULL;
        unsigned char kind = *p++;
        cols[i].kind = kind;
        if (kind == PGOUTPUT_TUPLE_TEXT) {
            if (end - p < 4)
                return NULL;
            size_t len = be32(p);
            p += 4;
            if (len > (size_t)(end - p))
                return NULL;
            cols[i].value = p;
            cols[i].len = len;
            p += len;
        } else if (kind != PGOUTPUT_TUPLE_NULL && kind != PGOUTPUT_TUPLE_UNCHANGED_TOAST) {
            return NULL;
        }
    }
    return p;
}

/* The action of a row-change message's tag: 0 INSERT, 1 UPDATE, 2 DELETE, -1 anything else. */
static inline int row_action(unsigned char tag) {
    return tag == PGOUTPUT_MSG_INSERT   ? 0
         : tag == PGOUTPUT_MSG_UPDATE ? 1
         : tag == PGOUTPUT_MSG_DELETE ? 2
                                      : -1;
}

/* A raw, non-streamed Insert, Update or Delete message of relation relid whose tuples have
 * exactly ncols text, null and unchanged-TOAST columns, read into old and new: *action is 0
 * (INSERT), 1 (UPDATE) or 2 (DELETE); *old_kind 'K' (identity columns only), 'O' (the whole
 * old row) or 0 (no old tuple). DEFER for anything else (the decoder says what is wrong). */
static int read_row_change(const unsigned char *data, size_t size, uint32_t relid,
                           Py_ssize_t ncols, Column *old, Column *new, int *action,
                           unsigned char *old_kind) {
    const unsigned char *p = data, *end = data + size;
    if (size < 6 || be32(data + 1) != relid)
        return DEFER;
    *action = row_action(data[0]);
    if (*action < 0)
        return DEFER;
    p += 5;
    *old_kind = 0;
    if (*action != 0 && (*p == 'K' || *p == 'O')) {
        *old_kind = *p++;
        if ((p = read_tuple(p, end, ncols, old)) == NULL)
            return DEFER;
    }
    if (*action != 2) {
        if (p == end || *p++ != 'N' || (p = read_tuple(p, end, ncols, new)) == NULL)
            return DEFER;
    } else if (*old_kind == 0) {
        return DEFER;
    }
    return p == end ? OK : DEFER; /* trailing bytes: DEFER too */
}

/* --- line(data, lsn, txn): what every formatter does around its formatting ----------------- */

/* A formatter's work on one message: its text into b, or DEFER, or FAIL with an error set.
 * It gets the message, its LSN, the plugin's Transaction, room for the old and new tuples'
 * columns (ncols each) and ncols column indexes of scratch. */
typedef int (*format_fn)(PyObject *self, Buf *b, const unsigned char *data, size_t size,
                         unsigned long long lsn, PyObject *txn, Column *old, Column *new,
                         Py_ssize_t *scratch);

/* A RowFormat is initialised once: line() sizes its column arrays from ncols before it calls
 * Python (attribute lookups on txn), so a second __init__ must not change them under it.
 * `made` is the object's heads, NULL until __init__ ran. */
static int init_once(PyObject *made) {
    if (made != NULL) {
        PyErr_SetString(PyExc_TypeError, "RowFormat.__init__ runs once: make a new RowFormat");
        return -1;
    }
    return 0;
}

/* The body of a RowFormat's line(data, lsn, txn) for a relation of ncols columns (`made`:
 * its heads, NULL if __init__ never ran): the arguments checked, the columns on the stack
 * (up to 64) or the heap; the text as bytes, None for DEFER, NULL with the error for FAIL. */
static PyObject *row_line(PyObject *self, PyObject *made, Py_ssize_t ncols,
                          PyObject *const *args, Py_ssize_t nargs, format_fn format) {
    if (made == NULL) {
        PyErr_SetString(PyExc_TypeError, "RowFormat.__init__ was not called");
        return NULL;
    }
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "line() takes data, lsn and txn");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "line(): data must be bytes");
        return NULL;
    }
    unsigned long long lsn = PyLong_AsUnsignedLongLong(args[1]);
    if (lsn == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Column stack_cols[2 * 64];
    Py_ssize_t stack_scratch[64];
    Column *cols = stack_cols;
    Py_ssize_t *scratch = stack_scratch;
    if (ncols > 64) {
        cols = PyMem_Malloc(sizeof(Column) * 2 * (size_t)ncols);
        scratch = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)ncols);
        if (cols == NULL || scratch == NULL) {
            PyMem_Free(cols);
            PyMem_Free(scratch);
            return PyErr_NoMemory();
        }
    }
    Buf b;
    buf_init(&b);
    int rc = format(self, &b, (const unsigned char *)PyBytes_AS_STRING(data),
                    (size_t)PyBytes_GET_SIZE(data), lsn, args[2], cols, cols + ncols, scratch);
    PyObject *result;
    if (rc == OK)
        result = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
    else if (rc == DEFER)
        result = Py_NewRef(Py_None);
    else
        result = NULL;
    buf_free(&b);
    if (cols != stack_cols) {
        PyMem_Free(cols);
        PyMem_Free(scratch);
    }
    return result;
}

#endif /* PGDECODE_PGROW_H */
