/*
 * emitters.text.native._textrow: the text emitter's line (test_decoding's format) for one pgoutput Insert,
 * Update or Delete message, built straight from the message's bytes.
 *
 * This is the text emitter's fast path, the counterpart of the json emitter's _jsonrow.c.
 * A RowFormat is made once per relation description from what emitters/text/relation.py
 * computes for it (the line heads, and per column its print_literal style and headers); its
 * line() returns exactly the bytes the emitter's Python change callback would write for a
 * message, or None when it does not handle that message. None is never an error: the
 * caller then runs the Python callback, the reference, which raises whatever error the
 * message deserves (binary-format columns, malformed messages).
 *
 * test_decoding writes a value's text as it is: no encoding check, nothing escaped but the
 * single quote of quoted types, doubled.
 */

#include "_pgrow.h" /* the output buffer and TupleData reading, shared with _jsonrow.c */

/* print_literal's styles, as emitters/text/relation.py numbers them (_QUOTED ... _BIT). */
enum { S_QUOTED, S_BARE, S_BOOL, S_BIT, S_STYLES };

typedef struct {
    PyObject_HEAD
    uint32_t relid;
    Py_ssize_t ncols;
    PyObject *heads;        /* 3 bytes: "table s.t: INSERT:", "... UPDATE:", "... DELETE:" */
    PyObject *opens;        /* per column: " name[type]:" and the value's opening quote */
    PyObject *bares;        /* per column: " name[type]:" alone (null, unchanged TOAST) */
    unsigned char *styles;  /* per column: S_* */
    int gated;              /* skip-empty-xacts: only once the transaction printed its BEGIN */
} RowFormat;

static int put_bytes(Buf *b, PyObject *bytes) {
    return put(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
}

/* A quoted value: every ' doubled. */
static int put_quoted(Buf *b, const unsigned char *s, size_t n) {
    const unsigned char *end = s + n;
    while (s < end) {
        const unsigned char *q = memchr(s, '\'', (size_t)(end - s));
        if (q == NULL)
            return put(b, s, (size_t)(end - s));
        TRY(put(b, s, (size_t)(q - s) + 1));
        TRY(put_byte(b, '\''));
        s = q + 1;
    }
    return OK;
}

/* tuple_to_stringinfo: the columns of a tuple, nulls left out when skip_nulls (old tuples). */
static int put_tuple(RowFormat *self, Buf *b, const Column *cols, int skip_nulls) {
    for (Py_ssize_t i = 0; i < self->ncols; i++) {
        const Column *col = &cols[i];
        if (col->kind == PGOUTPUT_TUPLE_NULL) {
            if (!skip_nulls) {
                TRY(put_bytes(b, PyTuple_GET_ITEM(self->bares, i)));
                TRY(PUT_LITERAL(b, "null"));
            }
            continue;
        }
        if (col->kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST) {
            TRY(put_bytes(b, PyTuple_GET_ITEM(self->bares, i)));
            TRY(PUT_LITERAL(b, "unchanged-toast-datum"));
            continue;
        }
        TRY(put_bytes(b, PyTuple_GET_ITEM(self->opens, i)));
        switch (self->styles[i]) {
        case S_QUOTED:
            TRY(put_quoted(b, col->value, col->len));
            TRY(put_byte(b, '\''));
            break;
        case S_BARE:
            TRY(put(b, col->value, col->len));
            break;
        case S_BOOL: /* as the Python callback: "t" is true, anything else false */
            if (col->len == 1 && col->value[0] == 't')
                TRY(PUT_LITERAL(b, "true"));
            else
                TRY(PUT_LITERAL(b, "false"));
            break;
        default: /* S_BIT: B'...' (the opening is in the header) */
            TRY(put(b, col->value, col->len));
            TRY(put_byte(b, '\''));
        }
    }
    return OK;
}

static int format_line(RowFormat *self, Buf *b, const unsigned char *data, size_t size,
                       Column *old, Column *new) {
    int action;
    unsigned char old_kind;
    TRY(read_row_change(data, size, self->relid, self->ncols, old, new, &action, &old_kind));
    TRY(put_bytes(b, PyTuple_GET_ITEM(self->heads, action)));
    if (action == 0)
        return put_tuple(self, b, new, 0);
    if (action == 2)
        return put_tuple(self, b, old, 1);
    if (old_kind != 0) {
        TRY(PUT_LITERAL(b, " old-key:"));
        TRY(put_tuple(self, b, old, 1));
        TRY(PUT_LITERAL(b, " new-tuple:"));
    }
    return put_tuple(self, b, new, 0);
}

static PyObject *private_str, *wrote_str;

/* Whether the transaction already printed its BEGIN (its output_plugin_private's wrote). */
static int began(PyObject *txn) {
    PyObject *data = PyObject_GetAttr(txn, private_str);
    if (data == NULL)
        return -1;
    PyObject *wrote = data == Py_None ? Py_NewRef(Py_False) : PyObject_GetAttr(data, wrote_str);
    Py_DECREF(data);
    if (wrote == NULL)
        return -1;
    int result = wrote == Py_True;
    Py_DECREF(wrote);
    return result;
}

PyDoc_STRVAR(line_doc,
"line(data, lsn, txn) -> bytes | None\n--\n\n"
"The text emitter's line for the raw, non-streamed Insert, Update or Delete message\n"
"``data`` of this relation, in ``txn``. None when the Python change callback must handle\n"
"the message (and, under skip-empty-xacts, while ``txn`` has not printed its BEGIN).");

static int format_gated(PyObject *self, Buf *b, const unsigned char *data, size_t size,
                        unsigned long long lsn, PyObject *txn, Column *old, Column *new,
                        Py_ssize_t *scratch) {
    RowFormat *format = (RowFormat *)self;
    if (format->gated) {
        int ok = began(txn);
        if (ok <= 0)
            return ok < 0 ? FAIL : DEFER;
    }
    return format_line(format, b, data, size, old, new);
}

static PyObject *RowFormat_line(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_line((PyObject *)self, self->heads, self->ncols, args, nargs, format_gated);
}

PyDoc_STRVAR(lines_doc,
"lines(datas, start, lsn, txn) -> (list[bytes], int)\n--\n\n"
"line(data, lsn, txn) for datas[start], datas[start + 1], ... in one call, up to the first\n"
"message line() gives None for: the lines, and that message's index (len(datas) if none).");

static PyObject *RowFormat_lines(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_lines((PyObject *)self, self->heads, self->ncols, args, nargs, format_gated);
}

static PyObject *RowFormat_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return row_call(self, args, kwargs,
                    (PyObject * (*)(PyObject *, PyObject *const *, Py_ssize_t))RowFormat_line);
}

static int all_bytes(PyObject *tuple) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(tuple, i)))
            return 0;
    return 1;
}

static int RowFormat_init(RowFormat *self, PyObject *args, PyObject *kwargs) {
    if (init_once(self->heads) < 0)
        return -1;
    static char *kwlist[] = {"relid", "heads", "styles", "opens", "bares", "gated", NULL};
    unsigned long relid;
    PyObject *heads, *opens, *bares;
    Py_buffer styles;
    int gated;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "kO!y*O!O!p:RowFormat", kwlist, &relid,
                                     &PyTuple_Type, &heads, &styles, &PyTuple_Type, &opens,
                                     &PyTuple_Type, &bares, &gated))
        return -1;
    Py_ssize_t ncols = styles.len;
    const char *why = NULL;
    if (PyTuple_GET_SIZE(heads) != 3 || !all_bytes(heads))
        why = "heads must be 3 bytes objects";
    else if (PyTuple_GET_SIZE(opens) != ncols || PyTuple_GET_SIZE(bares) != ncols)
        why = "styles, opens and bares must have one entry per column";
    else if (!all_bytes(opens) || !all_bytes(bares))
        why = "opens and bares must be bytes";
    for (Py_ssize_t i = 0; why == NULL && i < ncols; i++)
        if (((unsigned char *)styles.buf)[i] >= S_STYLES)
            why = "unknown style";
    if (why != NULL) {
        PyBuffer_Release(&styles);
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    unsigned char *copy = PyMem_Malloc((size_t)ncols + 1);
    if (copy == NULL) {
        PyBuffer_Release(&styles);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(copy, styles.buf, (size_t)ncols);
    PyBuffer_Release(&styles);
    PyMem_Free(self->styles);
    self->styles = copy;
    self->relid = (uint32_t)relid;
    self->ncols = ncols;
    self->gated = gated;
    Py_XSETREF(self->heads, Py_NewRef(heads));
    Py_XSETREF(self->opens, Py_NewRef(opens));
    Py_XSETREF(self->bares, Py_NewRef(bares));
    return 0;
}

static int RowFormat_traverse(RowFormat *self, visitproc visit, void *arg) {
    Py_VISIT(self->heads);
    Py_VISIT(self->opens);
    Py_VISIT(self->bares);
    return 0;
}

static int RowFormat_clear(RowFormat *self) {
    Py_CLEAR(self->heads);
    Py_CLEAR(self->opens);
    Py_CLEAR(self->bares);
    return 0;
}

static void RowFormat_dealloc(RowFormat *self) {
    PyObject_GC_UnTrack(self);
    RowFormat_clear(self);
    PyMem_Free(self->styles);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RowFormat_methods[] = {
    {"line", (PyCFunction)(void (*)(void))RowFormat_line, METH_FASTCALL, line_doc},
    {"lines", (PyCFunction)(void (*)(void))RowFormat_lines, METH_FASTCALL, lines_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(RowFormat_doc,
"RowFormat(relid, heads, styles, opens, bares, gated)\n--\n\n"
"The text emitter's lines for one relation description: ``heads`` the line's start for\n"
"INSERT, UPDATE and DELETE; per column its print_literal style (``styles``, one byte each),\n"
"its header with the value's opening (``opens``) and without (``bares``); ``gated``: only\n"
"in a transaction whose output_plugin_private says it ``wrote`` (skip-empty-xacts).");

static PyTypeObject RowFormat_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitters.text.native._textrow.RowFormat",
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
    .m_name = "emitters.text.native._textrow",
    .m_doc = "The text emitter's fast path: a row change's line straight from pgoutput bytes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__textrow(void) {
    static const char *style_names[S_STYLES] = {"QUOTED", "BARE", "BOOL", "BIT"};
    if (PyType_Ready(&RowFormat_Type) < 0)
        return NULL;
    private_str = PyUnicode_InternFromString("output_plugin_private");
    wrote_str = PyUnicode_InternFromString("wrote");
    if (private_str == NULL || wrote_str == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RowFormat", (PyObject *)&RowFormat_Type) < 0)
        goto error;
    for (int i = 0; i < S_STYLES; i++)
        if (PyModule_AddIntConstant(m, style_names[i], i) < 0)
            goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
