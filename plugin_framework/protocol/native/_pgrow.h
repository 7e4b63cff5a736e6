/*
 * _pgrow.h: what the C modules that read raw pgoutput row changes share (the emitters'
 * formatters, emitters/json/native/_jsonrow.c, _textrow.c, _wal2jsonrow.c, and the row filter's
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

/* An LSN as PostgreSQL prints it (%X/%X: upper-case hex halves, no leading zeros), as
 * protocol/lsn.py's str(LSN) does; without snprintf, which cost more than the rest of a
 * short line's fixed part. */
static inline int put_lsn(Buf *b, unsigned long long lsn) {
    static const char digits[] = "0123456789ABCDEF";
    char text[17];
    size_t n = 0;
    for (int half = 1; half >= 0; half--) {
        uint32_t v = (uint32_t)(lsn >> (32 * half));
        int shift = 28;
        while (shift > 0 && ((v >> shift) & 0xF) == 0)
            shift -= 4;
        for (; shift >= 0; shift -= 4)
            text[n++] = digits[(v >> shift) & 0xF];
        if (half)
            text[n++] = '/';
    }
    return put(b, text, n);
}
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
static inline int init_once(PyObject *made) {
    if (made != NULL) {
        PyErr_SetString(PyExc_TypeError, "RowFormat.__init__ runs once: make a new RowFormat");
        return -1;
    }
    return 0;
}

/* Room for a message's old and new columns and ncols column indexes of scratch: on the
 * stack (ScratchCols' arrays) up to 64 columns, on the heap past that. */
typedef struct {
    Column stack_cols[2 * 64];
    Py_ssize_t stack_scratch[64];
    Column *cols;
    Py_ssize_t *scratch;
} ScratchCols;

static int scratch_init(ScratchCols *s, Py_ssize_t ncols) {
    s->cols = s->stack_cols;
    s->scratch = s->stack_scratch;
    if (ncols > 64) {
        s->cols = PyMem_Malloc(sizeof(Column) * 2 * (size_t)ncols);
        s->scratch = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)ncols);
        if (s->cols == NULL || s->scratch == NULL) {
            PyMem_Free(s->cols);
            PyMem_Free(s->scratch);
            PyErr_NoMemory();
            return FAIL;
        }
    }
    return OK;
}

static void scratch_free(ScratchCols *s) {
    if (s->cols != s->stack_cols) {
        PyMem_Free(s->cols);
        PyMem_Free(s->scratch);
    }
}

static int check_made(PyObject *made) {
    if (made == NULL) {
        PyErr_SetString(PyExc_TypeError, "RowFormat.__init__ was not called");
        return FAIL;
    }
    return OK;
}

/* The body of a RowFormat's line(data, lsn, txn) for a relation of ncols columns (`made`:
 * its heads, NULL if __init__ never ran): the arguments checked, the columns in a
 * ScratchCols; the text as bytes, None for DEFER, NULL with the error for FAIL. */
static inline PyObject *row_line(PyObject *self, PyObject *made, Py_ssize_t ncols,
                                 PyObject *const *args, Py_ssize_t nargs, format_fn format) {
    if (check_made(made) < 0)
        return NULL;
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
    ScratchCols s;
    if (scratch_init(&s, ncols) < 0)
        return NULL;
    Buf b;
    buf_init(&b);
    int rc = format(self, &b, (const unsigned char *)PyBytes_AS_STRING(data),
                    (size_t)PyBytes_GET_SIZE(data), lsn, args[2], s.cols, s.cols + ncols,
                    s.scratch);
    PyObject *result;
    if (rc == OK)
        result = PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len);
    else if (rc == DEFER)
        result = Py_NewRef(Py_None);
    else
        result = NULL;
    buf_free(&b);
    scratch_free(&s);
    return result;
}

/* A RowFormat called as a function: its line(data, lsn, txn). */
static inline PyObject *row_call(PyObject *self, PyObject *args, PyObject *kwargs,
                                 PyObject *(*line)(PyObject *, PyObject *const *, Py_ssize_t)) {
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "a RowFormat takes no keyword arguments");
        return NULL;
    }
    return line(self, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
}

/* --- lines(datas, start, lsn, txn): line() for a run of messages in one call -------------- */

/* The body of a RowFormat's lines(datas, start, lsn, txn): what line(data, lsn, txn) gives
 * for datas[start], datas[start + 1], ... (a list of bytes), up to the first message it
 * would give None for, as (lines, next): next is that message's index, or len(datas). The
 * same `format` as line() writes each; only the calls from Python are saved. lsn: one for
 * all of them, or a list with each one's at its index (a replayed transaction's changes). */
static inline PyObject *row_lines(PyObject *self, PyObject *made, Py_ssize_t ncols,
                                  PyObject *const *args, Py_ssize_t nargs, format_fn format) {
    if (check_made(made) < 0)
        return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lines() takes datas, start, lsn and txn");
        return NULL;
    }
    PyObject *datas = args[0];
    if (!PyList_Check(datas)) {
        PyErr_SetString(PyExc_TypeError, "lines(): datas must be a list of bytes");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "lines(): start must not be negative");
        return NULL;
    }
    /* lsn: every change's, or a list of each one's (datas[i] at lsns[i]) */
    PyObject *lsns = PyList_Check(args[2]) ? args[2] : NULL;
    unsigned long long lsn = 0;
    if (lsns == NULL) {
        lsn = PyLong_AsUnsignedLongLong(args[2]);
        if (lsn == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    ScratchCols s;
    if (scratch_init(&s, ncols) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    Buf b;
    buf_init(&b);
    /* The list is read again at each step: a converter called from format could change it. */
    for (; out != NULL && i < PyList_GET_SIZE(datas); i++) {
        PyObject *data = PyList_GET_ITEM(datas, i);
        if (!PyBytes_Check(data)) {
            PyErr_SetString(PyExc_TypeError, "lines(): datas must be a list of bytes");
            Py_CLEAR(out);
            break;
        }
        if (lsns != NULL) {
            if (i >= PyList_GET_SIZE(lsns)) {
                PyErr_SetString(PyExc_ValueError, "lines(): fewer lsns than datas");
                Py_CLEAR(out);
                break;
            }
            lsn = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(lsns, i));
            if (lsn == (unsigned long long)-1 && PyErr_Occurred()) {
                Py_CLEAR(out);
                break;
            }
        }
        Py_INCREF(data);
        b.len = 0;
        int rc = format(self, &b, (const unsigned char *)PyBytes_AS_STRING(data),
                        (size_t)PyBytes_GET_SIZE(data), lsn, args[3], s.cols, s.cols + ncols,
                        s.scratch);
        Py_DECREF(data);
        if (rc == DEFER)
            break;
        PyObject *line = rc == OK ? PyBytes_FromStringAndSize(b.p, (Py_ssize_t)b.len) : NULL;
        if (line == NULL || PyList_Append(out, line) < 0)
            Py_CLEAR(out);
        Py_XDECREF(line);
    }
    buf_free(&b);
    scratch_free(&s);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", out, i);
}

#endif /* PGDECODE_PGROW_H */
