/*
 * emitters.wal2json.native._wal2jsonrow: the wal2json emitter's object for one pgoutput Insert, Update or
 * Delete message, built straight from the message's bytes: format version 2's line
 * (RowFormat), or format version 1's change in the transaction's document (V1RowFormat).
 *
 * The wal2json emitter's fast path, as _jsonrow.c is the json emitter's. A RowFormat is made
 * from the table's plan (emitters/wal2json/relation.py: compile_relation), for one
 * transaction's fields; its line() returns exactly the bytes that v2_change
 * (emitters/wal2json/v2.py) returns for a message, or None when it leaves the message to the
 * Python change callback: binary-format columns, malformed messages, an action the
 * "actions" option leaves out, and the cases where wal2json warns (no tuple identifier, no
 * old tuple of an UPDATE). None is never an error: the callback is the reference.
 *
 * Values print as relation.py's converters print them: numbers as they are (NaN and the
 * infinities as null), or quoted under numeric-data-types-as-string; booleans as true or
 * false; bytea without its leading \x; anything else as a JSON string, escaped as PostgreSQL's
 * escape_json does, byte by byte (text that is not UTF-8 is kept as it is).
 */

#include "_pgrow.h" /* the output buffer and TupleData reading, shared with _jsonrow.c */

/* How a column's value prints: one code per converter of relation.py (emitters/wal2json/
 * fast.py maps them; tests/emitters/test_wal2json_native.py holds each to its converter). */
enum { V_STRING, V_NUMBER, V_NUMBER_STRING, V_BOOL, V_BYTEA, V_CODES };

typedef struct {
    PyObject_HEAD
    uint32_t relid;
    Py_ssize_t ncols;
    PyObject *heads;       /* 3 bytes: '{"action":"I"' and the transaction's fields, U, D */
    PyObject *schema_table;
    PyObject *befores;     /* per column: '{"name":...,"value":' (also identity's) */
    PyObject *afters;      /* per column: what follows the value in "columns", "}" included */
    PyObject *pks;         /* per column: its whole object in "pk" */
    unsigned char *codes;  /* per column: V_* */
    Py_ssize_t *key;       /* the replica identity columns */
    Py_ssize_t nkeys;
    Py_ssize_t *pk;        /* the primary key's columns (include-pk) */
    Py_ssize_t npk;
    int actions;           /* bit 0 INSERT, 1 UPDATE, 2 DELETE: those the options print */
    int with_lsn;          /* include-lsn */
    int with_pk;           /* include-pk */
    int has_identity;      /* a replica identity index, or REPLICA IDENTITY FULL */
} RowFormat;

static int put_bytes(Buf *b, PyObject *bytes) {
    return put(b, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes));
}

/* PostgreSQL's escape_json over bytes: '"', '\\' and the controls below 0x20 escaped, every
 * other byte kept. */
static int put_escaped(Buf *b, const unsigned char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *end = s + n;
    TRY(put_byte(b, '"'));
    while (s < end) {
        const unsigned char *run = s;
        while (s < end && *s >= 0x20 && *s != '"' && *s != '\\')
            s++;
        TRY(put(b, run, (size_t)(s - run)));
        if (s == end)
            break;
        unsigned char c = *s++;
        char esc[6] = {'\\', 0, '0', '0', hex[c >> 4], hex[c & 15]};
        size_t len = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\t': esc[1] = 't'; break;
        case '\n': esc[1] = 'n'; break;
        case '\f': esc[1] = 'f'; break;
        case '\r': esc[1] = 'r'; break;
        default:
            esc[1] = 'u';
            len = 6;
        }
        TRY(put(b, esc, len));
    }
    return put_byte(b, '"');
}

static int is_special_number(const unsigned char *s, size_t n) {
    return (n == 3 && memcmp(s, "NaN", 3) == 0) || (n == 8 && memcmp(s, "Infinity", 8) == 0)
        || (n == 9 && memcmp(s, "-Infinity", 9) == 0);
}

static int put_value(const unsigned char *codes, Buf *b, Py_ssize_t i, const Column *col) {
    if (col->kind == PGOUTPUT_TUPLE_NULL)
        return PUT_LITERAL(b, "null");
    const unsigned char *s = col->value;
    size_t n = col->len;
    switch (codes[i]) {
    case V_NUMBER:
        if (is_special_number(s, n))
            return PUT_LITERAL(b, "null");
        return put(b, s, n);
    case V_NUMBER_STRING:
        TRY(put_byte(b, '"'));
        TRY(put(b, s, n));
        return put_byte(b, '"');
    case V_BOOL:
        if (n == 1 && s[0] == 't')
            return PUT_LITERAL(b, "true");
        return PUT_LITERAL(b, "false");
    case V_BYTEA:
        return n < 2 ? PUT_LITERAL(b, "\"\"") : put_escaped(b, s + 2, n - 2);
    default:
        return put_escaped(b, s, n);
    }
}

/* v2_change's text for the message in data, into b. */
static int format_line(PyObject *obj, Buf *b, const unsigned char *data, size_t size,
                       unsigned long long lsn, PyObject *txn, Column *old, Column *new,
                       Py_ssize_t *scratch) {
    RowFormat *self = (RowFormat *)obj;
    int action;
    unsigned char old_kind;
    TRY(read_row_change(data, size, self->relid, self->ncols, old, new, &action, &old_kind));
    if (!(self->actions & (1 << action)))
        return DEFER;
    const Column *identity = old_kind != 0 ? old : NULL;
    if (action != 0 && identity == NULL) {
        if (!self->has_identity)
            return DEFER; /* wal2json warns: no tuple identifier */
        if (action == 1) {
            if (self->nkeys == 0)
                return DEFER; /* wal2json warns: no old tuple data */
            identity = new;   /* the key did not change: wal2json takes it from the new row */
        }
    }
    TRY(put_bytes(b, PyTuple_GET_ITEM(self->heads, action)));
    if (self->with_lsn) {
        TRY(PUT_LITERAL(b, ",\"lsn\":\""));
        TRY(put_lsn(b, lsn));
        TRY(put_byte(b, '"'));
    }
    TRY(put_bytes(b, self->schema_table));
    if (action != 2) {
        int first = 1;
        TRY(PUT_LITERAL(b, ",\"columns\":["));
        for (Py_ssize_t i = 0; i < self->ncols; i++) {
            if (new[i].kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST)
                continue;
            if (!first)
                TRY(put_byte(b, ','));
            first = 0;
            TRY(put_bytes(b, PyTuple_GET_ITEM(self->befores, i)));
            TRY(put_value(self->codes, b, i, &new[i]));
            TRY(put_bytes(b, PyTuple_GET_ITEM(self->afters, i)));
        }
        TRY(put_byte(b, ']'));
    }
    if (identity != NULL) {
        int first = 1;
        TRY(PUT_LITERAL(b, ",\"identity\":["));
        for (Py_ssize_t k = 0; k < self->nkeys; k++) {
            Py_ssize_t i = self->key[k];
            if (identity[i].kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST)
                continue;
            if (!first)
                TRY(put_byte(b, ','));
            first = 0;
            TRY(put_bytes(b, PyTuple_GET_ITEM(self->befores, i)));
            TRY(put_value(self->codes, b, i, &identity[i]));
            TRY(put_byte(b, '}'));
        }
        TRY(put_byte(b, ']'));
    }
    if (self->with_pk) {
        const Column *source = old_kind != 0 ? old : new;
        int first = 1;
        TRY(PUT_LITERAL(b, ",\"pk\":["));
        for (Py_ssize_t k = 0; k < self->npk; k++) {
            Py_ssize_t i = self->pk[k];
            if (source[i].kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST)
                continue;
            if (!first)
                TRY(put_byte(b, ','));
            first = 0;
            TRY(put_bytes(b, PyTuple_GET_ITEM(self->pks, i)));
        }
        TRY(put_byte(b, ']'));
    }
    return put_byte(b, '}');
}

PyDoc_STRVAR(line_doc,
"line(data, lsn, txn) -> bytes | None\n--\n\n"
"The wal2json emitter's v2 object for the raw, non-streamed Insert, Update or Delete\n"
"message ``data`` of this relation at ``lsn``. None when the Python change callback must\n"
"handle the message.");

static PyObject *RowFormat_line(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_line((PyObject *)self, self->heads, self->ncols, args, nargs, format_line);
}

PyDoc_STRVAR(lines_doc,
"lines(datas, start, lsn, txn) -> (list[bytes], int)\n--\n\n"
"line(data, lsn, txn) for datas[start], datas[start + 1], ... in one call, up to the first\n"
"message line() gives None for: the lines, and that message's index (len(datas) if none).");

static PyObject *RowFormat_lines(RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_lines((PyObject *)self, self->heads, self->ncols, args, nargs, format_line);
}

static PyObject *RowFormat_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return row_call(self, args, kwargs,
                    (PyObject * (*)(PyObject *, PyObject *const *, Py_ssize_t))RowFormat_line);
}

static int all_bytes(PyObject *tuple, Py_ssize_t size) {
    if (PyTuple_GET_SIZE(tuple) != size)
        return 0;
    for (Py_ssize_t i = 0; i < size; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(tuple, i)))
            return 0;
    return 1;
}

/* A tuple of column indexes below ncols as a new C array (*count entries); NULL on error. */
static Py_ssize_t *indexes(PyObject *tuple, Py_ssize_t ncols, Py_ssize_t *count) {
    *count = PyTuple_GET_SIZE(tuple);
    Py_ssize_t *out = PyMem_Malloc(sizeof(Py_ssize_t) * ((size_t)*count + 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < *count; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, k));
        if (i < 0 || i >= ncols) {
            PyMem_Free(out);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "column index out of range");
            return NULL;
        }
        out[k] = i;
    }
    return out;
}

/* The value codes (one per column, each below V_CODES) as a new C array, the buffer
 * released either way; NULL with an error set. */
static unsigned char *take_codes(Py_buffer *codes) {
    const unsigned char *given = codes->buf;
    unsigned char *copy = NULL;
    for (Py_ssize_t i = 0; i < codes->len; i++)
        if (given[i] >= V_CODES) {
            PyErr_SetString(PyExc_ValueError, "unknown value code");
            goto done;
        }
    copy = PyMem_Malloc((size_t)codes->len + 1);
    if (copy == NULL)
        PyErr_NoMemory();
    else
        memcpy(copy, given, (size_t)codes->len);
done:
    PyBuffer_Release(codes);
    return copy;
}

static int RowFormat_init(RowFormat *self, PyObject *args, PyObject *kwargs) {
    if (init_once(self->heads) < 0)
        return -1;
    static char *kwlist[] = {"relid", "heads", "schema_table", "befores", "afters", "pks",
                             "codes", "key", "pk", "actions", "with_lsn", "with_pk",
                             "has_identity", NULL};
    unsigned long relid;
    PyObject *heads, *schema_table, *befores, *afters, *pks, *key, *pk;
    Py_buffer codes;
    int actions, with_lsn, with_pk, has_identity;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "kO!SO!O!O!y*O!O!ippp:RowFormat", kwlist, &relid, &PyTuple_Type,
            &heads, &schema_table, &PyTuple_Type, &befores, &PyTuple_Type, &afters,
            &PyTuple_Type, &pks, &codes, &PyTuple_Type, &key, &PyTuple_Type, &pk, &actions,
            &with_lsn, &with_pk, &has_identity))
        return -1;
    Py_ssize_t ncols = codes.len;
    const char *why = NULL;
    if (!all_bytes(heads, 3))
        why = "heads must be 3 bytes objects";
    else if (!all_bytes(befores, ncols) || !all_bytes(afters, ncols) || !all_bytes(pks, ncols))
        why = "befores, afters and pks must be bytes, one per column";
    if (why != NULL) {
        PyBuffer_Release(&codes);
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    Py_ssize_t nkeys, npk;
    unsigned char *code_copy = take_codes(&codes);
    Py_ssize_t *keys = code_copy == NULL ? NULL : indexes(key, ncols, &nkeys);
    Py_ssize_t *pks_idx = keys == NULL ? NULL : indexes(pk, ncols, &npk);
    if (pks_idx == NULL) {
        PyMem_Free(code_copy);
        PyMem_Free(keys);
        return -1;
    }
    PyMem_Free(self->codes);
    PyMem_Free(self->key);
    PyMem_Free(self->pk);
    self->codes = code_copy;
    self->key = keys;
    self->nkeys = nkeys;
    self->pk = pks_idx;
    self->npk = npk;
    self->relid = (uint32_t)relid;
    self->ncols = ncols;
    self->actions = actions;
    self->with_lsn = with_lsn;
    self->with_pk = with_pk;
    self->has_identity = has_identity;
    Py_XSETREF(self->heads, Py_NewRef(heads));
    Py_XSETREF(self->schema_table, Py_NewRef(schema_table));
    Py_XSETREF(self->befores, Py_NewRef(befores));
    Py_XSETREF(self->afters, Py_NewRef(afters));
    Py_XSETREF(self->pks, Py_NewRef(pks));
    return 0;
}

static int RowFormat_traverse(RowFormat *self, visitproc visit, void *arg) {
    Py_VISIT(self->heads);
    Py_VISIT(self->schema_table);
    Py_VISIT(self->befores);
    Py_VISIT(self->afters);
    Py_VISIT(self->pks);
    return 0;
}

static int RowFormat_clear(RowFormat *self) {
    Py_CLEAR(self->heads);
    Py_CLEAR(self->schema_table);
    Py_CLEAR(self->befores);
    Py_CLEAR(self->afters);
    Py_CLEAR(self->pks);
    return 0;
}

static void RowFormat_dealloc(RowFormat *self) {
    PyObject_GC_UnTrack(self);
    RowFormat_clear(self);
    PyMem_Free(self->codes);
    PyMem_Free(self->key);
    PyMem_Free(self->pk);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RowFormat_methods[] = {
    {"line", (PyCFunction)(void (*)(void))RowFormat_line, METH_FASTCALL, line_doc},
    {"lines", (PyCFunction)(void (*)(void))RowFormat_lines, METH_FASTCALL, lines_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(RowFormat_doc,
"RowFormat(relid, heads, schema_table, befores, afters, pks, codes, key, pk, actions,\n"
"          with_lsn, with_pk, has_identity)\n--\n\n"
"The wal2json emitter's v2 objects for one table plan and one transaction: ``heads`` up to\n"
"the transaction's fields for INSERT, UPDATE and DELETE; per column the text before and\n"
"after its value, its \"pk\" object and its value code; the replica identity and primary\n"
"key columns; ``actions`` (bits 0-2: INSERT, UPDATE, DELETE) those printed.");

static PyTypeObject RowFormat_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitters.wal2json.native._wal2jsonrow.RowFormat",
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

/* --- format version 1: one change of the transaction's document ------------------------- */

/* The fixed texts of a V1RowFormat (emitters/wal2json/fast.py builds them from relation.py's
 * plan, pretty-printing included). An empty KEYTYPES or KEYOIDS leaves that list out. */
enum {
    P_COLUMNS,        /* "columnnames" ... "columnvalues":[ */
    P_COMMA,          /* between values and names: "," or ", " */
    P_INSERT_END,     /* after an INSERT's values: "]" or "],", then a newline */
    P_UPDATE_END,     /* after an UPDATE's values */
    P_PK,             /* an INSERT's "pk" object, or empty */
    P_PK_COMMA,       /* an UPDATE's or DELETE's, or empty */
    P_KEYNAMES,       /* "oldkeys":{ "keynames":[ */
    P_KEYTYPES,       /* ], "keytypes":[ (or empty) */
    P_KEYOIDS,        /* ], "keytypeoids":[ (or empty) */
    P_KEYVALUES,      /* ], "keyvalues":[ */
    P_KEYS_END,       /* ] } of "oldkeys" */
    P_END,            /* the change's closing brace */
    V1_PIECES
};

typedef struct {
    PyObject_HEAD
    uint32_t relid;
    Py_ssize_t ncols;
    PyObject *heads;      /* 3 bytes: "{" ... "table":..., for INSERT, UPDATE, DELETE */
    PyObject *pieces;     /* V1_PIECES bytes, P_* */
    PyObject *names;      /* per column, JSON */
    PyObject *types;      /* per column, JSON, as "keytypes" prints it */
    PyObject *oids;       /* per column, as "keytypeoids" prints it */
    unsigned char *codes; /* per column: V_* */
    Py_ssize_t *key;      /* the replica identity columns */
    Py_ssize_t nkeys;
    int actions;          /* bit 0 INSERT, 1 UPDATE, 2 DELETE: those the options print */
    int has_identity;
} V1RowFormat;

#define PIECE(self, p) PyTuple_GET_ITEM((self)->pieces, (p))

/* A comma-separated list of one text per shown column. */
static int put_list(Buf *b, PyObject *texts, PyObject *comma, const Py_ssize_t *shown,
                    Py_ssize_t count) {
    for (Py_ssize_t k = 0; k < count; k++) {
        if (k > 0)
            TRY(put_bytes(b, comma));
        TRY(put_bytes(b, PyTuple_GET_ITEM(texts, shown[k])));
    }
    return OK;
}

/* "oldkeys" of row for the columns in indexes (NULL: every column): NULLs and unchanged
 * TOAST values left out. */
static int put_oldkeys(V1RowFormat *self, Buf *b, const Column *row, const Py_ssize_t *indexes,
                       Py_ssize_t count, Py_ssize_t *shown) {
    Py_ssize_t n = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t i = indexes == NULL ? k : indexes[k];
        if (row[i].kind == PGOUTPUT_TUPLE_TEXT)
            shown[n++] = i;
    }
    PyObject *comma = PIECE(self, P_COMMA);
    TRY(put_bytes(b, PIECE(self, P_KEYNAMES)));
    TRY(put_list(b, self->names, comma, shown, n));
    if (PyBytes_GET_SIZE(PIECE(self, P_KEYTYPES)) > 0) {
        TRY(put_bytes(b, PIECE(self, P_KEYTYPES)));
        TRY(put_list(b, self->types, comma, shown, n));
    }
    if (PyBytes_GET_SIZE(PIECE(self, P_KEYOIDS)) > 0) {
        TRY(put_bytes(b, PIECE(self, P_KEYOIDS)));
        TRY(put_list(b, self->oids, comma, shown, n));
    }
    TRY(put_bytes(b, PIECE(self, P_KEYVALUES)));
    for (Py_ssize_t k = 0; k < n; k++) {
        if (k > 0)
            TRY(put_bytes(b, comma));
        TRY(put_value(self->codes, b, shown[k], &row[shown[k]]));
    }
    return put_bytes(b, PIECE(self, P_KEYS_END));
}

/* v1_change's text for the message in data, without what goes before it in the document
 * (a newline and the comma after the previous change: the Python glue's). */
static int format_v1(PyObject *obj, Buf *b, const unsigned char *data, size_t size,
                     unsigned long long lsn, PyObject *txn, Column *old, Column *new,
                     Py_ssize_t *scratch) {
    V1RowFormat *self = (V1RowFormat *)obj;
    int action;
    unsigned char old_kind;
    (void)lsn;
    (void)txn;
    TRY(read_row_change(data, size, self->relid, self->ncols, old, new, &action, &old_kind));
    if (!(self->actions & (1 << action)))
        return DEFER;
    if (action != 0 && !self->has_identity)
        return DEFER; /* wal2json warns: no primary key or replica identity */
    TRY(put_bytes(b, PyTuple_GET_ITEM(self->heads, action)));
    if (action != 2) {
        for (Py_ssize_t i = 0; i < self->ncols; i++)
            if (new[i].kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST)
                return DEFER; /* the column lists of the values printed: Python's */
        TRY(put_bytes(b, PIECE(self, P_COLUMNS)));
        for (Py_ssize_t i = 0; i < self->ncols; i++) {
            if (i > 0)
                TRY(put_bytes(b, PIECE(self, P_COMMA)));
            TRY(put_value(self->codes, b, i, &new[i]));
        }
    }
    if (action == 0) {
        TRY(put_bytes(b, PIECE(self, P_INSERT_END)));
        TRY(put_bytes(b, PIECE(self, P_PK)));
    } else {
        if (action == 1)
            TRY(put_bytes(b, PIECE(self, P_UPDATE_END)));
        TRY(put_bytes(b, PIECE(self, P_PK_COMMA)));
        if (old_kind == 0)
            TRY(put_oldkeys(self, b, action == 1 ? new : old, self->key, self->nkeys, scratch));
        else if (action == 1)
            TRY(put_oldkeys(self, b, old, NULL, self->ncols, scratch));
        else
            TRY(put_oldkeys(self, b, old, self->key, self->nkeys, scratch));
    }
    return put_bytes(b, PIECE(self, P_END));
}

PyDoc_STRVAR(v1_line_doc,
"line(data, lsn, txn) -> bytes | None\n--\n\n"
"The wal2json emitter's v1 change object for the raw, non-streamed Insert, Update or Delete\n"
"message ``data`` of this relation, from its \"kind\" to its closing brace. None when the\n"
"Python change callback must handle the message.");

static PyObject *V1RowFormat_line(V1RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_line((PyObject *)self, self->heads, self->ncols, args, nargs, format_v1);
}

static PyObject *V1RowFormat_lines(V1RowFormat *self, PyObject *const *args, Py_ssize_t nargs) {
    return row_lines((PyObject *)self, self->heads, self->ncols, args, nargs, format_v1);
}

static int V1RowFormat_init(V1RowFormat *self, PyObject *args, PyObject *kwargs) {
    if (init_once(self->heads) < 0)
        return -1;
    static char *kwlist[] = {"relid", "heads", "pieces", "names", "types", "oids", "codes",
                             "key", "actions", "has_identity", NULL};
    unsigned long relid;
    PyObject *heads, *pieces, *names, *types, *oids, *key;
    Py_buffer codes;
    int actions, has_identity;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "kO!O!O!O!O!y*O!ip:V1RowFormat", kwlist, &relid, &PyTuple_Type,
            &heads, &PyTuple_Type, &pieces, &PyTuple_Type, &names, &PyTuple_Type, &types,
            &PyTuple_Type, &oids, &codes, &PyTuple_Type, &key, &actions, &has_identity))
        return -1;
    Py_ssize_t ncols = codes.len;
    const char *why = NULL;
    if (!all_bytes(heads, 3) || !all_bytes(pieces, V1_PIECES))
        why = "heads must be 3 bytes objects, pieces 12";
    else if (!all_bytes(names, ncols) || !all_bytes(types, ncols) || !all_bytes(oids, ncols))
        why = "names, types and oids must be bytes, one per column";
    if (why != NULL) {
        PyBuffer_Release(&codes);
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    Py_ssize_t nkeys;
    unsigned char *code_copy = take_codes(&codes);
    Py_ssize_t *keys = code_copy == NULL ? NULL : indexes(key, ncols, &nkeys);
    if (keys == NULL) {
        PyMem_Free(code_copy);
        return -1;
    }
    self->codes = code_copy;
    self->key = keys;
    self->nkeys = nkeys;
    self->relid = (uint32_t)relid;
    self->ncols = ncols;
    self->actions = actions;
    self->has_identity = has_identity;
    self->heads = Py_NewRef(heads);
    self->pieces = Py_NewRef(pieces);
    self->names = Py_NewRef(names);
    self->types = Py_NewRef(types);
    self->oids = Py_NewRef(oids);
    return 0;
}

static int V1RowFormat_traverse(V1RowFormat *self, visitproc visit, void *arg) {
    Py_VISIT(self->heads);
    Py_VISIT(self->pieces);
    Py_VISIT(self->names);
    Py_VISIT(self->types);
    Py_VISIT(self->oids);
    return 0;
}

static int V1RowFormat_clear(V1RowFormat *self) {
    Py_CLEAR(self->heads);
    Py_CLEAR(self->pieces);
    Py_CLEAR(self->names);
    Py_CLEAR(self->types);
    Py_CLEAR(self->oids);
    return 0;
}

static void V1RowFormat_dealloc(V1RowFormat *self) {
    PyObject_GC_UnTrack(self);
    V1RowFormat_clear(self);
    PyMem_Free(self->codes);
    PyMem_Free(self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef V1RowFormat_methods[] = {
    {"line", (PyCFunction)(void (*)(void))V1RowFormat_line, METH_FASTCALL, v1_line_doc},
    {"lines", (PyCFunction)(void (*)(void))V1RowFormat_lines, METH_FASTCALL, lines_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(V1RowFormat_doc,
"V1RowFormat(relid, heads, pieces, names, types, oids, codes, key, actions, has_identity)\n"
"--\n\n"
"The wal2json emitter's v1 change objects for one table plan: ``heads`` up to \"table\" for\n"
"INSERT, UPDATE and DELETE; the fixed texts between the parts (see P_* in the source); per\n"
"column its name, type and type OID as \"oldkeys\" prints them, and its value code; the\n"
"replica identity columns; ``actions`` (bits 0-2: INSERT, UPDATE, DELETE) those printed.");

static PyTypeObject V1RowFormat_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "emitters.wal2json.native._wal2jsonrow.V1RowFormat",
    .tp_basicsize = sizeof(V1RowFormat),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = V1RowFormat_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)V1RowFormat_init,
    .tp_dealloc = (destructor)V1RowFormat_dealloc,
    .tp_traverse = (traverseproc)V1RowFormat_traverse,
    .tp_clear = (inquiry)V1RowFormat_clear,
    .tp_methods = V1RowFormat_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "emitters.wal2json.native._wal2jsonrow",
    .m_doc = "The wal2json emitter's fast path: a row change's v1 or v2 object from pgoutput "
             "bytes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__wal2jsonrow(void) {
    static const char *code_names[V_CODES] = {"STRING", "NUMBER", "NUMBER_STRING", "BOOL",
                                              "BYTEA"};
    if (PyType_Ready(&RowFormat_Type) < 0 || PyType_Ready(&V1RowFormat_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RowFormat", (PyObject *)&RowFormat_Type) < 0
        || PyModule_AddObjectRef(m, "V1RowFormat", (PyObject *)&V1RowFormat_Type) < 0)
        goto error;
    for (int i = 0; i < V_CODES; i++)
        if (PyModule_AddIntConstant(m, code_names[i], i) < 0)
            goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
