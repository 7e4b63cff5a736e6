/*
 * plugin_framework.spark.changes.native._changerows: the Spark change builder's rows of one pgoutput
 * Insert, Update or Delete message, appended straight from the message's bytes.
 *
 * ChangeBuilder.add_change (plugin_framework/spark/changes/builder.py) is the reference: it takes a
 * decoded Change and appends to the builder's column lists the maps' names and raw text
 * values, the rows as JSON objects of typed values, the unchanged TOAST names and the key. A
 * ChangeRows, made once per relation description, appends the same to the same lists from
 * the raw message, without the Change, Row and value objects in between, and with each value's
 * JSON from plugin_framework/pgtypes/native/_jsonvalue.h (the json emitter's C values, the
 * mirror of the converters the builder calls). Whatever could DEFER (a binary column, a
 * malformed message, a value whose converter raises) is decided before the first append, so
 * a None leaves the lists as they were and add_change then takes the change (and raises what
 * it deserves). tests/spark/test_spark_changerows.py holds the two equal.
 */

#include "_jsonvalue.h" /* values as JSON; the output buffer and TupleData reading */

/* The builder's lists, in the order of ChangeBuilder.lists(). */
enum {
    L_LSN, L_SEQ, L_OP, L_REL, L_TXN, L_KEY_LEN, L_KEY_K, L_KEY_V, L_BEFORE_LEN, L_BEFORE_K,
    L_BEFORE_V, L_AFTER_LEN, L_AFTER_K, L_AFTER_V, L_BEFORE_JSON, L_AFTER_JSON, L_TOAST,
    L_COUNT
};

static PyObject *op_update, *op_delete;

typedef struct {
    PyObject_HEAD
    uint32_t relid;
    JsonColumns cols; /* the JSON values: names as JSON strings, codes, converters */
    PyObject *names;  /* per column: its name as a str, the maps' keys */
    PyObject *empty;  /* the list shared by the rows without unchanged TOAST values */
} ChangeRows;

/* list.append(item) of a new reference (NULL: an error is set already). */
static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return FAIL;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc < 0 ? FAIL : OK;
}

/* A tuple's map entries, the columns `which` (all when NULL) but its unchanged TOAST ones:
 * names to keys, raw texts (None for NULL) to values. The number of entries, or -1. */
static Py_ssize_t append_entries(ChangeRows *self, PyObject *keys, PyObject *values,
                                 const Column *cols, const Py_ssize_t *which,
                                 Py_ssize_t count) {
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t i = which == NULL ? k : which[k];
        const Column *col = &cols[i];
        if (col->kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST)
            continue;
        PyObject *value = col->kind == PGOUTPUT_TUPLE_NULL
            ? Py_NewRef(Py_None)
            : PyBytes_FromStringAndSize((const char *)col->value, (Py_ssize_t)col->len);
        if (value == NULL)
            return -1;
        if (PyList_Append(keys, PyTuple_GET_ITEM(self->names, i)) < 0) {
            Py_DECREF(value);
            return -1;
        }
        if (append_new(values, value) < 0)
            return -1;
        n++;
    }
    return n;
}

/* The row's key (its replica identity columns) from `cols`; a None length without any. */
static int append_key(ChangeRows *self, PyObject **lists, const Column *cols) {
    if (self->cols.nkeys == 0)
        return append_new(lists[L_KEY_LEN], Py_NewRef(Py_None));
    Py_ssize_t n = append_entries(self, lists[L_KEY_K], lists[L_KEY_V], cols,
                                  self->cols.key_idx, self->cols.nkeys);
    return n < 0 ? FAIL : append_new(lists[L_KEY_LEN], PyLong_FromSsize_t(n));
}

/* A row (before or after): its entries, their count, its JSON. */
static int append_row(ChangeRows *self, PyObject *len, PyObject *keys, PyObject *values,
                      PyObject *json, const Column *cols, const Py_ssize_t *which,
                      Py_ssize_t count, const Buf *b) {
    Py_ssize_t n = append_entries(self, keys, values, cols, which, count);
    if (n < 0 || append_new(len, PyLong_FromSsize_t(n)) < 0)
        return FAIL;
    return append_new(json, PyBytes_FromStringAndSize(b->p, (Py_ssize_t)b->len));
}

/* No row: None for its length and its JSON. */
static int append_no_row(PyObject *len, PyObject *json) {
    if (append_new(len, Py_NewRef(Py_None)) < 0)
        return FAIL;
    return append_new(json, Py_NewRef(Py_None));
}

/* The appends, once the JSON of both rows is made (old_json, new_json) and the new row's
 * unchanged TOAST columns are toast[0..ntoast). args are append()'s. */
static int append_change(ChangeRows *self, PyObject **lists, PyObject *const *args,
                         int action, unsigned char old_kind, const Column *old,
                         const Column *new, const Buf *old_json, const Buf *new_json,
                         const Py_ssize_t *toast, Py_ssize_t ntoast) {
    const JsonColumns *cols = &self->cols;
    if (action != 2) {
        TRY(append_row(self, lists[L_AFTER_LEN], lists[L_AFTER_K], lists[L_AFTER_V],
                       lists[L_AFTER_JSON], new, NULL, cols->ncols, new_json));
        if (ntoast == 0) {
            TRY(append_new(lists[L_TOAST], Py_NewRef(self->empty)));
        } else {
            PyObject *names = PyList_New(ntoast);
            if (names == NULL)
                return FAIL;
            for (Py_ssize_t k = 0; k < ntoast; k++)
                PyList_SET_ITEM(names, k, Py_NewRef(PyTuple_GET_ITEM(self->names, toast[k])));
            TRY(append_new(lists[L_TOAST], names));
        }
        TRY(append_key(self, lists, new));
    } else {
        TRY(append_no_row(lists[L_AFTER_LEN], lists[L_AFTER_JSON]));
        TRY(append_new(lists[L_TOAST], Py_NewRef(self->empty)));
    }
    if (old_kind != 0) {
        int is_key = old_kind == 'K';
        TRY(append_row(self, lists[L_BEFORE_LEN], lists[L_BEFORE_K], lists[L_BEFORE_V],
                       lists[L_BEFORE_JSON], old, is_key ? cols->key_idx : NULL,
                       is_key ? cols->nkeys : cols->ncols, old_json));
        if (action == 2)
            TRY(append_key(self, lists, old));
    } else {
        TRY(append_no_row(lists[L_BEFORE_LEN], lists[L_BEFORE_JSON]));
    }
    PyObject *op = action == 0 ? args[5] : action == 1 ? op_update : op_delete;
    TRY(append_new(lists[L_OP], Py_NewRef(op)));
    /* lsn, seq, rel and txn: the arguments as they are */
    TRY(append_new(lists[L_LSN], Py_NewRef(args[1])));
    TRY(append_new(lists[L_SEQ], Py_NewRef(args[2])));
    TRY(append_new(lists[L_REL], Py_NewRef(args[3])));
    return append_new(lists[L_TXN], Py_NewRef(args[4]));
}

PyDoc_STRVAR(append_doc,
"append(data, lsn, seq, rel, txn, insert_op, lists) -> int | None\n--\n\n"
"Append the raw, non-streamed Insert, Update or Delete message ``data`` of this relation,\n"
"at ``lsn``, to ``lists`` (ChangeBuilder.lists()) as ChangeBuilder.add_change would: the\n"
"change is its transaction's ``seq``-th, its relation the builder's ``rel``-th, its\n"
"transaction the builder's ``txn``-th, and an INSERT's op is ``insert_op``. Returns the\n"
"bytes the builder counts for it, or None (nothing appended) when add_change must take it.");

static PyObject *ChangeRows_append(ChangeRows *self, PyObject *const *args, Py_ssize_t nargs) {
    if (self->names == NULL) {
        PyErr_SetString(PyExc_TypeError, "ChangeRows.__init__ was not called");
        return NULL;
    }
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "append() takes data, lsn, seq, rel, txn, insert_op and lists");
        return NULL;
    }
    PyObject *data = args[0], *lists = args[6];
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "append(): data must be bytes");
        return NULL;
    }
    int lists_ok = PyTuple_Check(lists) && PyTuple_GET_SIZE(lists) == L_COUNT;
    for (Py_ssize_t k = 0; lists_ok && k < L_COUNT; k++)
        lists_ok = PyList_Check(PyTuple_GET_ITEM(lists, k));
    if (!lists_ok) {
        PyErr_SetString(PyExc_TypeError, "append(): lists must be a tuple of 17 lists");
        return NULL;
    }
    const JsonColumns *cols = &self->cols;
    Py_ssize_t ncols = cols->ncols;
    ScratchCols s;
    if (scratch_init(&s, ncols) < 0)
        return NULL;
    Column *old = s.cols, *new = s.cols + ncols;
    Buf old_json, new_json;
    buf_init(&old_json);
    buf_init(&new_json);
    int action;
    unsigned char old_kind;
    Py_ssize_t ntoast = 0;
    int rc = read_row_change((const unsigned char *)PyBytes_AS_STRING(data),
                             (size_t)PyBytes_GET_SIZE(data), self->relid, ncols, old, new,
                             &action, &old_kind);
    if (rc == OK && old_kind != 0) { /* first: the scratch then keeps the new row's TOAST */
        int is_key = old_kind == 'K';
        rc = put_row(cols, &old_json, old, is_key ? cols->key_idx : NULL,
                     is_key ? cols->nkeys : ncols, s.scratch, &ntoast);
    }
    ntoast = 0;
    if (rc == OK && action != 2)
        rc = put_row(cols, &new_json, new, NULL, ncols, s.scratch, &ntoast);
    if (rc == OK)
        rc = append_change(self, &PyTuple_GET_ITEM(lists, 0), args, action, old_kind, old, new,
                           &old_json, &new_json, s.scratch, ntoast);
    PyObject *result = NULL;
    if (rc == OK)
        result = PyLong_FromSize_t(64 + 2 * (old_json.len + new_json.len));
    else if (rc == DEFER)
        result = Py_NewRef(Py_None);
    buf_free(&old_json);
    buf_free(&new_json);
    scratch_free(&s);
    return result;
}

static int ChangeRows_init(ChangeRows *self, PyObject *args, PyObject *kwargs) {
    if (self->names != NULL) { /* append() sizes its arrays from the columns */
        PyErr_SetString(PyExc_TypeError, "ChangeRows.__init__ runs once: make a new one");
        return -1;
    }
    static char *kwlist[] = {"relid", "names", "json_names", "codes", "converters", "key_idx",
                             "dumps", "empty", NULL};
    unsigned long relid;
    PyObject *names, *json_names, *converters, *key_idx, *dumps, *empty;
    Py_buffer codes;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "kO!O!y*O!O!OO!:ChangeRows", kwlist, &relid,
                                     &PyTuple_Type, &names, &PyTuple_Type, &json_names, &codes,
                                     &PyTuple_Type, &converters, &PyTuple_Type, &key_idx,
                                     &dumps, &PyList_Type, &empty))
        return -1;
    int ok = PyTuple_GET_SIZE(names) == PyTuple_GET_SIZE(json_names);
    for (Py_ssize_t i = 0; ok && i < PyTuple_GET_SIZE(names); i++)
        ok = PyUnicode_Check(PyTuple_GET_ITEM(names, i));
    if (!ok) {
        PyBuffer_Release(&codes);
        PyErr_SetString(PyExc_ValueError, "names must be one str per column");
        return -1;
    }
    int rc = json_columns_set(&self->cols, json_names, &codes, converters, key_idx, dumps);
    PyBuffer_Release(&codes);
    if (rc < 0)
        return -1;
    self->relid = (uint32_t)relid;
    Py_XSETREF(self->empty, Py_NewRef(empty));
    Py_XSETREF(self->names, Py_NewRef(names));
    return 0;
}

static int ChangeRows_traverse(ChangeRows *self, visitproc visit, void *arg) {
    Py_VISIT(self->names);
    Py_VISIT(self->empty);
    return json_columns_traverse(&self->cols, visit, arg);
}

static int ChangeRows_clear(ChangeRows *self) {
    Py_CLEAR(self->names);
    Py_CLEAR(self->empty);
    json_columns_clear(&self->cols);
    return 0;
}

static void ChangeRows_dealloc(ChangeRows *self) {
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->names);
    Py_CLEAR(self->empty);
    json_columns_free(&self->cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ChangeRows_methods[] = {
    {"append", (PyCFunction)(void (*)(void))ChangeRows_append, METH_FASTCALL, append_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(ChangeRows_doc,
"ChangeRows(relid, names, json_names, codes, converters, key_idx, dumps, empty)\n--\n\n"
"The Spark change builder's rows of one relation description, appended straight from raw\n"
"messages: ``names`` each column's name, ``json_names`` the same as JSON strings, ``codes``\n"
"one conversion code per column, ``converters`` each column's Python text converter,\n"
"``key_idx`` the identity columns, ``dumps`` orjson.dumps, ``empty`` the list a row\n"
"without unchanged TOAST values gets.");

static PyTypeObject ChangeRows_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "plugin_framework.spark.changes.native._changerows.ChangeRows",
    .tp_basicsize = sizeof(ChangeRows),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = ChangeRows_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ChangeRows_init,
    .tp_dealloc = (destructor)ChangeRows_dealloc,
    .tp_traverse = (traverseproc)ChangeRows_traverse,
    .tp_clear = (inquiry)ChangeRows_clear,
    .tp_methods = ChangeRows_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "plugin_framework.spark.changes.native._changerows",
    .m_doc = "The Spark change builder's fast path: a change's rows straight from pgoutput "
             "bytes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__changerows(void) {
    if (PyType_Ready(&ChangeRows_Type) < 0)
        return NULL;
    op_update = PyUnicode_InternFromString("UPDATE");
    op_delete = PyUnicode_InternFromString("DELETE");
    if (op_update == NULL || op_delete == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "ChangeRows", (PyObject *)&ChangeRows_Type) < 0 ||
        json_add_codes(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
