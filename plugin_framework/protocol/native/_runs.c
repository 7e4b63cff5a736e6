/*
 * plugin_framework.protocol.native._runs: runs of row changes in a batch of XLogData
 * messages, for the walsender source's hot loop.
 *
 * row_change_run(batch, start, make_lsn) mirrors protocol/runs.py's row_change_run_py, the
 * reference: from batch[start], the XLogData messages ('w', a 25-byte header, then the
 * pgoutput payload) whose payload is an Insert, Update or Delete with the same type byte and
 * the same 32-bit field after it as the first's; returns (payloads, lsns, next): each
 * payload's bytes, its start LSN made by make_lsn (the Python LSN constructor for wire
 * values), and the index of the first message not in the run. tests/protocol/test_runs.py
 * holds the two equal.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "pgoutput_tags.h"

#define XLOGDATA_TAG 'w'
#define XLOGDATA_HEADER_SIZE 25 /* the tag, start LSN, end LSN, send time */
#define RUN_KEY_SIZE 5          /* the payload's type byte and the id after it */

static int is_row_change_tag(unsigned char tag) {
    return tag == PGOUTPUT_MSG_INSERT || tag == PGOUTPUT_MSG_UPDATE
        || tag == PGOUTPUT_MSG_DELETE;
}

PyDoc_STRVAR(row_change_run_doc,
"row_change_run(batch, start, make_lsn) -> (list[bytes], list[LSN], int)\n--\n\n"
"The run of row changes at batch[start] (see protocol/runs.py).");

static PyObject *row_change_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "row_change_run() takes batch, start and make_lsn");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "row_change_run(): start must not be negative");
        return NULL;
    }
    PyObject *make_lsn = args[2];
    PyObject *seq = PySequence_Fast(args[0], "row_change_run() takes a sequence of buffers");
    if (seq == NULL)
        return NULL;
    PyObject *datas = PyList_New(0);
    PyObject *lsns = PyList_New(0);
    unsigned char key[RUN_KEY_SIZE];
    Py_ssize_t end = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t i = start;
    if (datas == NULL || lsns == NULL)
        goto error;
    for (; i < end; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &view, PyBUF_SIMPLE) < 0)
            goto error;
        const unsigned char *raw = (const unsigned char *)view.buf;
        Py_ssize_t len = view.len;
        if (len < XLOGDATA_HEADER_SIZE + RUN_KEY_SIZE || raw[0] != XLOGDATA_TAG
                || !is_row_change_tag(raw[XLOGDATA_HEADER_SIZE])) {
            PyBuffer_Release(&view);
            break;
        }
        const unsigned char *head = raw + XLOGDATA_HEADER_SIZE;
        if (PyList_GET_SIZE(datas) == 0) {
            memcpy(key, head, RUN_KEY_SIZE);
        } else if (memcmp(key, head, RUN_KEY_SIZE) != 0) {
            PyBuffer_Release(&view);
            break;
        }
        uint64_t wal_start = 0;
        for (int b = 1; b <= 8; b++)
            wal_start = (wal_start << 8) | raw[b];
        PyObject *data = PyBytes_FromStringAndSize((const char *)head,
                                                   len - XLOGDATA_HEADER_SIZE);
        PyBuffer_Release(&view);
        if (data == NULL)
            goto error;
        int failed = PyList_Append(datas, data);
        Py_DECREF(data);
        if (failed < 0)
            goto error;
        PyObject *number = PyLong_FromUnsignedLongLong(wal_start);
        if (number == NULL)
            goto error;
        PyObject *lsn = PyObject_CallOneArg(make_lsn, number);
        Py_DECREF(number);
        if (lsn == NULL)
            goto error;
        failed = PyList_Append(lsns, lsn);
        Py_DECREF(lsn);
        if (failed < 0)
            goto error;
    }
    Py_DECREF(seq);
    PyObject *next = PyLong_FromSsize_t(i);
    if (next == NULL) {
        Py_DECREF(datas);
        Py_DECREF(lsns);
        return NULL;
    }
    return Py_BuildValue("(NNN)", datas, lsns, next);
error:
    Py_DECREF(seq);
    Py_XDECREF(datas);
    Py_XDECREF(lsns);
    return NULL;
}

static PyMethodDef methods[] = {
    {"row_change_run", (PyCFunction)(void (*)(void))row_change_run, METH_FASTCALL,
     row_change_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "plugin_framework.protocol.native._runs",
    .m_doc = "Runs of row changes in a batch of XLogData messages, in C (the reference: "
             "protocol/runs.py's row_change_run_py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__runs(void) { return PyModule_Create(&module); }
