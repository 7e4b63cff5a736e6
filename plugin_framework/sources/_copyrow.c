/*
 * plugin_framework.sources._copyrow: one row of COPY ... TO STDOUT (text format) as the
 * pgoutput Insert message the stream would carry for it.
 *
 * The initial snapshot's fast path (sources/snapshot.py). Its reference is the Python path
 * beside it: psycopg's COPY parser (Copy.rows()) and the protocol encoder
 * (encode(Insert(...))); tests/test_snapshot.py holds the two byte-equal on rows a real
 * server copies out. The text format (PostgreSQL's CopyReadAttributesText): fields separated
 * by a tab, the row ended by a newline, \N alone for NULL, and backslash escapes: \b \f \n \r
 * \t \v, one to three octal digits, x and one or two hex digits, any other character itself.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* insert_message(head, ncols, row) -> bytes: head is b"I" + relation id + b"N" + ncols (the
 * message's fixed part), row one COPY text row (its newline optional). ValueError when the
 * row does not have ncols fields. */
static PyObject *insert_message(PyObject *self, PyObject *args) {
    Py_buffer head, row;
    int ncols;
    if (!PyArg_ParseTuple(args, "y*iy*", &head, &ncols, &row))
        return NULL;
    const char *p = row.buf, *end = p + row.len;
    if (end > p && end[-1] == '\n') end--;
    /* Each field grows by at most 5 bytes (kind and length) and never by unescaping. */
    Py_ssize_t cap = head.len + row.len + 5 * (Py_ssize_t)ncols + 5;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap);
    if (out == NULL) goto done;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, head.buf, head.len);
    char *w = o + head.len;
    int fields = 0;
    for (;;) {
        const char *f = p;
        while (p < end && *p != '\t') p++;
        if (++fields > ncols) break;
        if (p - f == 2 && f[0] == '\\' && f[1] == 'N') {
            *w++ = 'n';
        } else {
            char *kind = w;
            *kind = 't';
            char *v = w + 5, *start = v;
            for (const char *s = f; s < p; s++) {
                char c = *s;
                if (c != '\\' || s + 1 >= p) { *v++ = c; continue; }
                c = *++s;
                switch (c) {
                case 'b': *v++ = '\b'; break;
                case 'f': *v++ = '\f'; break;
                case 'n': *v++ = '\n'; break;
                case 'r': *v++ = '\r'; break;
                case 't': *v++ = '\t'; break;
                case 'v': *v++ = '\v'; break;
                case 'x':
                    if (s + 1 < p && hexval(s[1]) >= 0) {
                        int val = hexval(*++s);
                        if (s + 1 < p && hexval(s[1]) >= 0) val = val * 16 + hexval(*++s);
                        *v++ = (char)val;
                    } else {
                        *v++ = 'x';
                    }
                    break;
                default:
                    if (c >= '0' && c <= '7') {
                        int val = c - '0';
                        if (s + 1 < p && s[1] >= '0' && s[1] <= '7') {
                            val = val * 8 + (*++s - '0');
                            if (s + 1 < p && s[1] >= '0' && s[1] <= '7') val = val * 8 + (*++s - '0');
                        }
                        *v++ = (char)val;
                    } else {
                        *v++ = c;
                    }
                }
            }
            uint32_t n = (uint32_t)(v - start);
            kind[1] = (char)(n >> 24); kind[2] = (char)(n >> 16);
            kind[3] = (char)(n >> 8); kind[4] = (char)n;
            w = v;
        }
        if (p >= end) break;
        p++; /* the tab */
    }
    if (fields != ncols) {
        PyErr_Format(PyExc_ValueError, "a COPY row of %d fields for a table of %d columns",
                     fields, ncols);
        Py_CLEAR(out);
        goto done;
    }
    _PyBytes_Resize(&out, w - o);
done:
    PyBuffer_Release(&head);
    PyBuffer_Release(&row);
    return out;
}

static PyMethodDef methods[] = {
    {"insert_message", insert_message, METH_VARARGS,
     "insert_message(head, ncols, row) -> the pgoutput Insert message of one COPY text row"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copyrow", "COPY text rows as pgoutput Insert messages.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__copyrow(void) { return PyModule_Create(&module); }
