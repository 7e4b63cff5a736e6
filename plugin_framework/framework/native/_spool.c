/*
 * plugin_framework.framework.native._spool: a spool's entries packed and read back a run at
 * a time, for streamed transactions held until their end (framework/spool.py).
 *
 * An entry is a header (big-endian: the message's LSN, 8 bytes; the xid of its
 * (sub)transaction, 4; in_stream, 1; the message's length, 4) and the raw pgoutput message.
 * pack_entries(lsns, xid, in_stream, raws) mirrors spool.py's pack_entries_py, and
 * read_run(buf, pos, end, strip, make_lsn) its read_run_py, the references;
 * tests/framework/test_spool.py holds each pair equal.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pgoutput_tags.h"

#define ENTRY_HEAD 17     /* lsn, xid, in_stream, length */
#define CHANGE_MIN_SIZE 5 /* the tag and the relation id (after the xid, in a stream) */

static void put_u32(unsigned char *out, uint32_t v) {
    out[0] = (unsigned char)(v >> 24);
    out[1] = (unsigned char)(v >> 16);
    out[2] = (unsigned char)(v >> 8);
    out[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *in) {
    return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) | in[3];
}

PyDoc_STRVAR(pack_entries_doc,
"pack_entries(lsns, xid, in_stream, raws) -> bytes\n--\n\n"
"The spool entries of raws at lsns, end to end (see framework/spool.py).");

static PyObject *pack_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "pack_entries() takes lsns, xid, in_stream, raws");
        return NULL;
    }
    unsigned long xid = PyLong_AsUnsignedLong(args[1]);
    if (xid == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (xid > 0xFFFFFFFFUL) {
        PyErr_SetString(PyExc_OverflowError, "pack_entries(): xid out of range");
        return NULL;
    }
    int in_stream = PyObject_IsTrue(args[2]);
    if (in_stream < 0)
        return NULL;
    PyObject *lsns = PySequence_Fast(args[0], "pack_entries() takes a sequence of LSNs");
    if (lsns == NULL)
        return NULL;
    PyObject *raws = PySequence_Fast(args[3], "pack_entries() takes a sequence of messages");
    if (raws == NULL) {
        Py_DECREF(lsns);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(raws);
    if (PySequence_Fast_GET_SIZE(lsns) != n) {
        PyErr_SetString(PyExc_ValueError, "pack_entries(): as many LSNs as messages");
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PySequence_Fast_GET_ITEM(raws, i);
        if (!PyBytes_Check(raw)) {
            PyErr_SetString(PyExc_TypeError, "pack_entries(): messages are bytes");
            goto done;
        }
        if (PyBytes_GET_SIZE(raw) > 0xFFFFFFFFLL) {
            PyErr_SetString(PyExc_OverflowError, "pack_entries(): a message over 4 GB");
            goto done;
        }
        total += ENTRY_HEAD + PyBytes_GET_SIZE(raw);
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PySequence_Fast_GET_ITEM(raws, i);
        unsigned long long lsn = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(lsns, i));
        if (lsn == (unsigned long long)-1 && PyErr_Occurred()) {
            Py_CLEAR(out);
            goto done;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(raw);
        put_u32(w, (uint32_t)(lsn >> 32));
        put_u32(w + 4, (uint32_t)lsn);
        put_u32(w + 8, (uint32_t)xid);
        w[12] = (unsigned char)in_stream;
        put_u32(w + 13, (uint32_t)len);
        memcpy(w + ENTRY_HEAD, PyBytes_AS_STRING(raw), (size_t)len);
        w += ENTRY_HEAD + len;
    }
done:
    Py_DECREF(lsns);
    Py_DECREF(raws);
    return out;
}

static int is_change(const unsigned char *raw, uint32_t len, int in_stream) {
    if (len < (uint32_t)(CHANGE_MIN_SIZE + 4 * in_stream))
        return 0;
    return raw[0] == PGOUTPUT_MSG_INSERT || raw[0] == PGOUTPUT_MSG_UPDATE
        || raw[0] == PGOUTPUT_MSG_DELETE;
}

PyDoc_STRVAR(read_run_doc,
"read_run(buf, pos, end, strip, make_lsn) -> (datas, lsns, xid, in_stream, is_run, next)\n"
"--\n\n"
"The run of row changes (or the one entry) at pos of buf[:end] (see framework/spool.py).");

static PyObject *read_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "read_run() takes buf, pos, end, strip, make_lsn");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    if (end == -1 && PyErr_Occurred())
        return NULL;
    int strip = PyObject_IsTrue(args[3]);
    if (strip < 0)
        return NULL;
    if (pos < 0) {
        PyErr_SetString(PyExc_ValueError, "read_run(): pos must not be negative");
        return NULL;
    }
    PyObject *make_lsn = args[4];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (end > view.len)
        end = view.len;
    PyObject *datas = PyList_New(0), *lsns = PyList_New(0);
    uint32_t xid = 0;
    int in_stream = 0, is_run = 0, first = 1;
    unsigned char relid[4] = {0, 0, 0, 0};
    if (datas == NULL || lsns == NULL)
        goto error;
    while (end - pos >= ENTRY_HEAD) {
        const unsigned char *h = buf + pos;
        uint64_t lsn = ((uint64_t)get_u32(h) << 32) | get_u32(h + 4);
        uint32_t entry_xid = get_u32(h + 8);
        int entry_in_stream = h[12] != 0;
        uint32_t len = get_u32(h + 13);
        if ((uint64_t)(end - pos - ENTRY_HEAD) < len)
            break;
        const unsigned char *raw = h + ENTRY_HEAD;
        int skip = 4 * entry_in_stream;
        int change = is_change(raw, len, entry_in_stream);
        if (!first && !(is_run && change && entry_xid == xid && entry_in_stream == in_stream
                        && memcmp(raw + 1 + skip, relid, 4) == 0))
            break;
        if (first) {
            first = 0;
            xid = entry_xid;
            in_stream = entry_in_stream;
            is_run = change;
            if (change)
                memcpy(relid, raw + 1 + skip, 4);
        }
        PyObject *data;
        if (strip && change && skip) {
            data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len - skip);
            if (data != NULL) {
                char *d = PyBytes_AS_STRING(data);
                d[0] = (char)raw[0];
                memcpy(d + 1, raw + 1 + skip, len - 1 - skip);
            }
        } else {
            data = PyBytes_FromStringAndSize((const char *)raw, (Py_ssize_t)len);
        }
        if (data == NULL)
            goto error;
        int failed = PyList_Append(datas, data);
        Py_DECREF(data);
        if (failed < 0)
            goto error;
        PyObject *number = PyLong_FromUnsignedLongLong(lsn);
        if (number == NULL)
            goto error;
        PyObject *lsn_object = PyObject_CallOneArg(make_lsn, number);
        Py_DECREF(number);
        if (lsn_object == NULL)
            goto error;
        failed = PyList_Append(lsns, lsn_object);
        Py_DECREF(lsn_object);
        if (failed < 0)
            goto error;
        pos += ENTRY_HEAD + (Py_ssize_t)len;
        if (!is_run)
            break;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NNkOOn)", datas, lsns, (unsigned long)xid,
                         in_stream ? Py_True : Py_False, is_run ? Py_True : Py_False, pos);
error:
    PyBuffer_Release(&view);
    Py_XDECREF(datas);
    Py_XDECREF(lsns);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_entries", (PyCFunction)(void (*)(void))pack_entries, METH_FASTCALL,
     pack_entries_doc},
    {"read_run", (PyCFunction)(void (*)(void))read_run, METH_FASTCALL, read_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "plugin_framework.framework.native._spool",
    .m_doc = "A spool's entries packed and read back a run at a time, in C (the references: "
             "framework/spool.py's pack_entries_py and read_run_py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__spool(void) { return PyModule_Create(&module); }
