/*
 * plugin_framework.framework.native._text: the textual-output check of a line, or of a run of
 * lines.
 *
 * A plugin in textual mode must write UTF-8, as PostgreSQL checks a textual plugin's output
 * (framework/context.py, ``_check_textual``: bytes.decode, strict). A formatter's ``lines``
 * hands the context a thousand lines at once; decoding them made a str of each (or of their
 * join) only to throw it away, a fifth of an initial snapshot's time. This walks the bytes
 * instead, with the same rules as Python's strict UTF-8 decoder (RFC 3629): no overlong
 * forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no cut-off sequence.
 * tests/framework/test_text_check.py holds it equal to bytes.decode on hypothesis-made bytes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Whether s[0..n) is UTF-8. */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    const unsigned char *end = s + n;
    while (s < end) {
        /* ASCII eight bytes at a time: most text is mostly ASCII */
        while (end - s >= 8) {
            uint64_t word;
            memcpy(&word, s, 8);
            if (word & UINT64_C(0x8080808080808080))
                break;
            s += 8;
        }
        if (s >= end)
            break;
        unsigned char c = *s;
        if (c < 0x80) {
            s++;
            continue;
        }
        /* the lead byte decides the length and the range of the first continuation byte */
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;       /* overlong below U+0800 */
            else if (c == 0xED) hi = 0x9F;  /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;       /* overlong below U+10000 */
            else if (c == 0xF4) hi = 0x8F;  /* above U+10FFFF */
        } else {
            return 0;  /* a continuation byte, C0/C1 (overlong), or F5..FF */
        }
        if (end - s <= more)
            return 0;
        if (s[1] < lo || s[1] > hi)
            return 0;
        for (int i = 2; i <= more; i++)
            if ((s[i] & 0xC0) != 0x80)
                return 0;
        s += more + 1;
    }
    return 1;
}

/* Whether the bytes-like object is UTF-8: 1 or 0, or -1 with an exception (not bytes-like). */
static int object_utf8(PyObject *data) {
    if (PyBytes_CheckExact(data))
        return valid_utf8((const unsigned char *)PyBytes_AS_STRING(data),
                          PyBytes_GET_SIZE(data));
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int ok = valid_utf8(view.buf, view.len);
    PyBuffer_Release(&view);
    return ok;
}

/* first_invalid_utf8(lines) -> int: the index of the first of lines (a list of bytes-like
 * objects) that is not UTF-8, or -1 if all are. */
static PyObject *first_invalid_utf8(PyObject *self, PyObject *lines) {
    if (!PyList_Check(lines)) {
        PyErr_SetString(PyExc_TypeError, "first_invalid_utf8 takes a list");
        return NULL;
    }
    /* The GIL is held throughout: nothing can change the list or its bytes meanwhile. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(lines); i++) {
        int ok = object_utf8(PyList_GET_ITEM(lines, i));
        if (ok < 0)
            return NULL;
        if (!ok)
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

/* is_utf8(data) -> bool: whether the bytes-like data is UTF-8. */
static PyObject *is_utf8(PyObject *self, PyObject *data) {
    int ok = object_utf8(data);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"is_utf8", is_utf8, METH_O, "Whether the bytes are UTF-8."},
    {"first_invalid_utf8", first_invalid_utf8, METH_O,
     "The index of the first line that is not UTF-8, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "plugin_framework.framework.native._text",
    "The textual-output check of a line or of a run of lines.", -1, methods,
};

PyMODINIT_FUNC PyInit__text(void) { return PyModule_Create(&module); }
