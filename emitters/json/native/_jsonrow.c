/*
 * emitters.json.native._jsonrow: the json emitter's line for one pgoutput Insert, Update or Delete
 * message, built straight from the message's bytes.
 *
 * This is the json emitter's fast path (see "Speed" in emitters/json/__init__.py and
 * docs/performance.md). A RowFormat is made once per relation description; its line() takes
 * a raw, non-streamed row-change message and returns exactly the bytes the emitter's Python
 * change callback would write for it, or None when it does not handle that message. None is
 * never an error: the caller then runs the Python callback, which is the reference, and
 * which raises whatever error the message deserves. So everything unusual is left to
 * Python: binary-format columns, malformed messages, invalid UTF-8, and values outside the
 * common forms of each type (those go through the column's Python converter and orjson,
 * one value at a time). The values themselves are plugin_framework/pgtypes/native/
 * _jsonvalue.h's, which the Spark change builder's C module shares.
 */

#include "_jsonvalue.h" /* values as JSON; the output buffer and TupleData reading */

/* --- the RowFormat type --------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    uint32_t relid;
    PyObject *heads; /* 6 bytes: (before, key) for INSERT, UPDATE, DELETE */
    JsonColumns cols;
} RowFormat;

static int put_head(RowFormat *self, Buf *b, int index) {
    PyObject *head = PyTuple_GET_ITEM(self->heads, index);
    return put(b, PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
}

/* The line of the message in data, into b. */
static int format_line(RowFormat *self, Buf *b, const unsigned char *data, size_t size,
                       unsigned long long lsn, PyObject *fields, Column *old, Column *new,
                       Py_ssize_t *toast) {
    const JsonColumns *cols = &self->cols;
    int action;
    unsigned char old_kind;
    TRY(read_row_change(data, size, self->relid, cols->ncols, old, new, &action, &old_kind));

    TRY(put_head(self, b, 2 * action));
    TRY(PUT_LITERAL(b, ",\"lsn\":\""));
    TRY(put_lsn(b, lsn));
    TRY(put_byte(b, '"'));
    TRY(put(b, PyBytes_AS_STRING(fields), (size_t)PyBytes_GET_SIZE(fields)));
    TRY(put_head(self, b, 2 * action + 1));

    Py_ssize_t ntoast;
    if (action == 0) {
        TRY(PUT_LITERAL(b, ",\"new\":"));
        return put_row(cols, b, new, NULL, cols->ncols, toast, &ntoast);
    }
    if (old_kind == 0) {
        TRY(PUT_LITERAL(b, ",\"old_is_key\":false,\"old\":null"));
    } else {
        if (old_kind == 'K') {
            TRY(PUT_LITERAL(b, ",\"old_is_key\":true,\"old\":"));
            TRY(put_row(cols, b, old, cols->key_idx, cols->nkeys, toast, &ntoast));
        } else {
            TRY(PUT_LITERAL(b, ",\"old_is_key\":false,\"old\":"));
            TRY(put_row(cols, b, old, NULL, cols->ncols, toast, &ntoast));
        }
        if (ntoast > 0) {
            TRY(PUT_LITERAL(b, ",\"old_unchanged_toast\":"));
            TRY(put_names(cols, b, toast, ntoast));
        }
    }
    if (action == 1) {
        TRY(PUT_LITERAL(b, ",\"new\":"));
        TRY(put_row(cols, b, new, NULL, cols->ncols, toast, &ntoast));
        TRY(PUT_LITERAL(b, ",\"unchanged_toast\":"));
        TRY(put_names(cols, b, toast, ntoast));
    }
    return OK;
}

static PyObject *fields_str;

PyDoc_STRVAR(line_doc,
"line(data, lsn, txn) -> bytes | None\n--\n\n"
"The json emitter's line for the raw, non-streamed Insert, Update or Delete message\n"
"``data`` of this relation at ``lsn``, in ``txn`` (whose output_plugin_private holds the\n"
"line's transaction fields, as the emitter's begin callback leaves them), without the\n"
"closing brace's newline. None when the Python change callback must handle the message.");

/* The line, with the transaction's fields from txn.output_plugin_private. */
static int format_txn_line(PyObject *self, Buf *b, const unsigned char *data, size_t size,
                           unsigned long long lsn, PyObject *txn, Column *old, Column *new,
                           Py_ssize_t *toast) {
    PyObject *fields = PyObject_GetAttr(txn, fields_str);
    if (fields == NULL)
        return FAIL;
    int rc = DEFER; /* fields not bytes: not begun by the emitter, Python computes them */
    if (PyBytes_Check(fields)) {
        rc = format_line((RowFormat *)self, b, data, size, lsn, fields, old, new, toast);
        if (rc == OK)
            rc = put_byte(b, '}');
    }
    Py_DECREF(fields);
    return rc;
}

static PyObject *RowFormat_line(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_line((PyObject *)self, self->heads, self->cols.ncols, args, nargs, format_txn_line);
}

PyDoc_STRVAR(lines_doc,
"lines(datas, start, lsn, txn) -> (list[bytes], int)\n--\n\n"
"line(data, lsn, txn) for datas[start], datas[start + 1], ... in one call, up to the first\n"
"message line() gives None for: the lines, and that message's index (len(datas) if none).");

static PyObject *RowFormat_lines(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_lines((PyObject *)self, self->heads, self->cols.ncols, args, nargs,
                     format_txn_line);
}

static PyObject *RowFormat_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return row_call(self, args, kwargs,
                    (PyObject * (*)(PyObject *, PyObject *const *, Py_ssize_t))RowFormat_line);
}

static int RowFormat_init(RowFormat *self, PyObject *args, PyObject *kwargs) {
    if (init_once(self->heads) < 0)
        return -1;
    static char *kwlist[] = {"relid", "heads", "names", "codes", "converters", "key_idx",
                             "dumps", NULL};
    unsigned long relid;
    PyObject *heads, *names, *converters, *key_idx, *dumps;
    Py_buffer codes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "kO!O!y*O!O!O:RowFormat", kwlist, &relid,
                                     &PyTuple_Type, &heads, &PyTuple_Type, &names, &codes,
                                     &PyTuple_Type, &converters, &PyTuple_Type, &key_idx,
                                     &dumps))
        return -1;
    int heads_ok = PyTuple_GET_SIZE(heads) == 6;
    for (Py_ssize_t i = 0; heads_ok && i < 6; i++)
        heads_ok = PyBytes_Check(PyTuple_GET_ITEM(heads, i));
    if (!heads_ok) {
        PyBuffer_Release(&codes);
        PyErr_SetString(PyExc_ValueError, "heads must be 6 bytes objects");
        return -1;
    }
    int rc = json_columns_set(&self->cols, names, &codes, converters, key_idx, dumps);
    PyBuffer_Release(&codes);
    if (rc < 0)
        return -1;
    self->relid = (uint32_t)relid;
    Py_XSETREF(self->heads, Py_NewRef(heads));
    return 0;
}

static int RowFormat_traverse(RowFormat *self, visitproc visit, void *arg) {
    Py_VISIT(self->heads);
    return json_columns_traverse(&self->cols, visit, arg);
}

static int RowFormat_clear(RowFormat *self) {
    Py_CLEAR(self->heads);
    json_columns_clear(&self->cols);
    return 0;
}

static void RowFormat_dealloc(RowFormat *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->heads);
    json_columns_free(&self->cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RowFormat_methods[] = {
    {"line", (PyCFunction)(void (*)(void))RowFormat_line, METH_FASTCALL, line_doc},
    {"lines", (PyCFunction)(void (*)(void))RowFormat_lines, METH_FASTCALL, lines_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(RowFormat_doc,
"RowFormat(relid, heads, names, codes, converters, key_idx, dumps)\n--\n\n"
"The json emitter's lines for one relation description: ``heads`` are the line's fixed\n"
"parts (before the LSN, after the transaction fields) for INSERT, UPDATE and DELETE;\n"
"``names`` each column's name as a JSON string; ``codes`` one conversion code per column;\n"
"``converters`` each column's Python converter; ``key_idx`` the identity columns.");

static PyTypeObject RowFormat_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitters.json.native._jsonrow.RowFormat",
    .tp_basicsize = sizeof(RowFormat),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = RowFormat_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RowFormat_init,
    .tp_dealloc = (destructor)RowFormat_dealloc,
    .tp_traverse = (traverseproc)RowFormat_traverse,
    .tp_clear = (inquiry)RowFormat_clear,
    .tp_methods = RowFormat_methods,
    .tp_call = RowFormat_call,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "emitters.json.native._jsonrow",
    .m_doc = "The json emitter's fast path: a row change's line straight from pgoutput bytes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__jsonrow(void) {
    if (PyType_Ready(&RowFormat_Type) < 0)
        return NULL;
    fields_str = PyUnicode_InternFromString("output_plugin_private");
    if (fields_str == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RowFormat", (PyObject *)&RowFormat_Type) < 0 ||
        json_add_codes(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
