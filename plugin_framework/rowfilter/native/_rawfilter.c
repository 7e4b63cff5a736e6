/*
 * plugin_framework.rowfilter.native._rawfilter: a table's row filters decided on a raw
 * pgoutput Insert, Update or Delete message, without decoding it.
 *
 * A RawFilter mirrors PublicationFilters.filter_change (rowfilter/publication.py) for one
 * relation whose changes the publications deliver as they are (no column list, published
 * under their own name): verdict(data) is PASS when filter_change would return the change
 * unaltered, DROP when it would return None, and UNSURE for anything else, which the caller
 * then hands to filter_change, the reference: an UPDATE that enters or leaves the filter (it
 * becomes an INSERT or a DELETE), a value C does not read (binary format, an unchanged TOAST
 * value without a fallback, text that is not UTF-8), an evaluation error (overflow, division
 * by zero: filter_change raises it), a malformed message.
 *
 * The filters are programs that rowfilter/raw.py compiles from the same analyzed expression
 * as evaluate.py's Compiler, for the node kinds and functions listed there (integers,
 * booleans, text equality, AND/OR/NOT, NULL and boolean tests). They evaluate as the Python
 * closures do: strict operators evaluate every argument, then give NULL if one is NULL;
 * AND and OR evaluate their arguments in order and stop at the deciding one. Where the
 * Python code would skip an argument that C evaluates (constant folding), C can only meet an
 * error there, which is UNSURE: the verdicts C gives are the Python code's.
 * tests/rowfilter/test_rowfilter_raw.py holds the two equal on random filters and rows.
 */

#include "_pgrow.h" /* raw row-change reading, shared with the emitters' formatters */

enum { DROP, PASS, UNSURE };

/* Program nodes: (op, a, b, value, text), a and b the indexes of argument nodes. */
enum {
    N_VAR_INT,     /* column a as an integer */
    N_VAR_BOOL,    /* column a as a boolean */
    N_VAR_TEXT,    /* column a as text (UTF-8) */
    N_CONST_INT,   /* value */
    N_CONST_BOOL,  /* value: 0 or 1 */
    N_CONST_TEXT,  /* text */
    N_CONST_NULL,
    N_ADD, N_SUB, N_MUL, N_DIV, N_MOD, /* a op b; the result's range: value 2, 4 or 8 bytes */
    N_CAST,        /* a in the range of value (2, 4 or 8 bytes) */
    N_EQ, N_NE, N_LT, N_LE, N_GT, N_GE, /* integers and booleans */
    N_TEXT_EQ, N_TEXT_NE,
    N_DISTINCT,    /* a IS DISTINCT FROM b; value 1: as text, else as integers */
    N_AND, N_OR, N_NOT,
    N_IS_NULL, N_IS_NOT_NULL,
    N_IS_TRUE, N_IS_NOT_TRUE, N_IS_FALSE, N_IS_NOT_FALSE, /* IS [NOT] UNKNOWN: IS [NOT] NULL */
    N_OPS
};

typedef struct {
    int op;
    int a, b;
    long long value;
    const unsigned char *text; /* N_CONST_TEXT: borrowed from the program's bytes */
    size_t len;
} Node;

typedef struct {
    Node *nodes;
    int count; /* the root is the last node */
} Program;

/* A value: NULL, an integer or boolean, or text; or unsure (stop, ask Python). */
enum { V_NULL, V_INT, V_TEXT, V_UNSURE };
typedef struct {
    int kind;
    long long i;
    const unsigned char *s;
    size_t n;
} Value;

static const Value unsure = {V_UNSURE, 0, NULL, 0};
static const Value null_value = {V_NULL, 0, NULL, 0};

static Value int_value(long long i) {
    Value v = {V_INT, i, NULL, 0};
    return v;
}

/* The row a program reads, and the one its unchanged TOAST values come from (or NULL). */
typedef struct {
    const Column *row, *fallback;
} Rows;

static int in_range(long long v, long long size) {
    return size == 8 || (size == 4 && v >= INT32_MIN && v <= INT32_MAX)
        || (size == 2 && v >= INT16_MIN && v <= INT16_MAX);
}

/* An integer's text as the server writes it: an optional '-', then digits. */
static int parse_int(const unsigned char *s, size_t n, long long *out) {
    size_t i = 0;
    int negative = 0;
    if (n > 0 && s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (i == n)
        return 0;
    unsigned long long acc = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        unsigned d = (unsigned)(s[i] - '0');
        if (acc > (ULLONG_MAX - d) / 10)
            return 0;
        acc = acc * 10 + d;
    }
    if (negative) {
        if (acc > (unsigned long long)LLONG_MAX + 1)
            return 0;
        *out = acc == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)acc;
    } else {
        if (acc > (unsigned long long)LLONG_MAX)
            return 0;
        *out = (long long)acc;
    }
    return 1;
}

/* Whether s is well-formed UTF-8 (what Python's decode accepts: no surrogates, no overlong
 * forms, nothing past U+10FFFF). */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i < len || s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += len;
    }
    return 1;
}

/* Column i's value, as rowfilter/publication.py's getter reads it. */
static Value column(const Rows *rows, const Node *node) {
    const Column *col = &rows->row[node->a];
    if (col->kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST) {
        if (rows->fallback == NULL || rows->fallback[node->a].kind != PGOUTPUT_TUPLE_TEXT)
            return unsure; /* an error in Python (or a binary-format value) */
        col = &rows->fallback[node->a];
    }
    if (col->kind == PGOUTPUT_TUPLE_NULL)
        return null_value;
    if (col->kind != PGOUTPUT_TUPLE_TEXT)
        return unsure;
    long long i;
    switch (node->op) {
    case N_VAR_INT:
        return parse_int(col->value, col->len, &i) ? int_value(i) : unsure;
    case N_VAR_BOOL:
        if (col->len == 1 && (col->value[0] == 't' || col->value[0] == 'f'))
            return int_value(col->value[0] == 't');
        return unsure;
    default: {
        if (!valid_utf8(col->value, col->len))
            return unsure;
        Value v = {V_TEXT, 0, col->value, col->len};
        return v;
    }
    }
}

static Value eval(const Program *prog, int at, const Rows *rows);

static Value arith(int op, long long x, long long y, long long size) {
    long long r;
    switch (op) {
    case N_ADD:
        if (__builtin_add_overflow(x, y, &r))
            return unsure;
        break;
    case N_SUB:
        if (__builtin_sub_overflow(x, y, &r))
            return unsure;
        break;
    case N_MUL:
        if (__builtin_mul_overflow(x, y, &r))
            return unsure;
        break;
    case N_DIV:
        if (y == 0 || (x == LLONG_MIN && y == -1))
            return unsure;
        r = x / y; /* truncated, as PostgreSQL divides */
        break;
    default: /* N_MOD: the sign of x, as PostgreSQL's; never out of range */
        if (y == 0)
            return unsure;
        return int_value(y == -1 ? 0 : x % y);
    }
    return in_range(r, size) ? int_value(r) : unsure;
}

static int same_text(Value x, Value y) {
    return x.n == y.n && (x.n == 0 || memcmp(x.s, y.s, x.n) == 0);
}

/* The tests of a boolean value: 1 true, 0 false. */
static Value bool_test(int op, Value v) {
    int known = v.kind == V_INT;
    int truth = known && v.i != 0;
    switch (op) {
    case N_IS_TRUE: return int_value(truth);
    case N_IS_NOT_TRUE: return int_value(!truth);
    case N_IS_FALSE: return int_value(known && !truth);
    case N_IS_NOT_FALSE: return int_value(!(known && !truth));
    case N_IS_NULL: return int_value(v.kind == V_NULL);
    default: return int_value(v.kind != V_NULL); /* N_IS_NOT_NULL */
    }
}

static Value eval(const Program *prog, int at, const Rows *rows) {
    const Node *node = &prog->nodes[at];
    int op = node->op;
    switch (op) {
    case N_VAR_INT:
    case N_VAR_BOOL:
    case N_VAR_TEXT:
        return column(rows, node);
    case N_CONST_INT:
    case N_CONST_BOOL:
        return int_value(node->value);
    case N_CONST_TEXT: {
        Value v = {V_TEXT, 0, node->text, node->len};
        return v;
    }
    case N_CONST_NULL:
        return null_value;
    case N_CAST: {
        Value x = eval(prog, node->a, rows);
        if (x.kind != V_INT)
            return x;
        return in_range(x.i, node->value) ? x : unsure;
    }
    case N_NOT: {
        Value x = eval(prog, node->a, rows);
        return x.kind == V_INT ? int_value(!x.i) : x;
    }
    case N_IS_NULL:
    case N_IS_NOT_NULL:
    case N_IS_TRUE:
    case N_IS_NOT_TRUE:
    case N_IS_FALSE:
    case N_IS_NOT_FALSE: {
        Value x = eval(prog, node->a, rows);
        return x.kind == V_UNSURE ? x : bool_test(op, x);
    }
    case N_AND:
    case N_OR: {
        /* in order, stopping at the deciding value (false for AND, true for OR) */
        long long stop = op == N_OR;
        Value x = eval(prog, node->a, rows);
        if (x.kind == V_UNSURE || (x.kind == V_INT && x.i == stop))
            return x;
        Value y = eval(prog, node->b, rows);
        if (y.kind == V_UNSURE || (y.kind == V_INT && y.i == stop))
            return y;
        return x.kind == V_NULL || y.kind == V_NULL ? null_value : int_value(!stop);
    }
    default:
        break;
    }
    /* strict binary operators: both arguments, then NULL if either is NULL */
    Value x = eval(prog, node->a, rows);
    if (x.kind == V_UNSURE)
        return x;
    Value y = eval(prog, node->b, rows);
    if (y.kind == V_UNSURE)
        return y;
    if (op == N_DISTINCT) {
        if (x.kind == V_NULL || y.kind == V_NULL)
            return int_value((x.kind == V_NULL) != (y.kind == V_NULL));
        return int_value(node->value ? !same_text(x, y) : x.i != y.i);
    }
    if (x.kind == V_NULL || y.kind == V_NULL)
        return null_value;
    switch (op) {
    case N_EQ: return int_value(x.i == y.i);
    case N_NE: return int_value(x.i != y.i);
    case N_LT: return int_value(x.i < y.i);
    case N_LE: return int_value(x.i <= y.i);
    case N_GT: return int_value(x.i > y.i);
    case N_GE: return int_value(x.i >= y.i);
    case N_TEXT_EQ: return int_value(same_text(x, y));
    case N_TEXT_NE: return int_value(!same_text(x, y));
    default: return arith(op, x.i, y.i, node->value);
    }
}

/* --- the filter of one relation ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *source;       /* what it was made of: keeps the programs' texts alive */
    uint32_t relid;
    Py_ssize_t ncols;
    int actions;            /* bit 0 INSERT, 1 UPDATE, 2 DELETE: those published */
    Program *programs[3];   /* per action: NULL (no filter), else nprograms[i] ORed ones */
    int nprograms[3];
} RawFilter;

/* The ORed filters on a row: 1 if one is true, 0 if none, UNSURE as soon as one is (the
 * Python code would evaluate it, and may raise). */
static int matches(const RawFilter *self, int action, const Column *row,
                   const Column *fallback) {
    Rows rows = {row, fallback};
    for (int k = 0; k < self->nprograms[action]; k++) {
        const Program *prog = &self->programs[action][k];
        Value v = eval(prog, prog->count - 1, &rows);
        if (v.kind == V_UNSURE)
            return UNSURE;
        if (v.kind == V_INT && v.i != 0)
            return 1;
    }
    return 0;
}

static int decide(RawFilter *self, const unsigned char *data, size_t size, Column *old,
                  Column *new) {
    int action;
    unsigned char old_kind;
    if (read_row_change(data, size, self->relid, self->ncols, old, new, &action, &old_kind)
        != OK)
        return UNSURE;
    if (!(self->actions & (1 << action)))
        return DROP;
    if (self->programs[action] == NULL)
        return PASS;
    int m;
    if (action == 0 || (action == 1 && old_kind == 0))
        m = matches(self, action, new, NULL);
    else if (action == 2)
        m = matches(self, action, old, NULL);
    else {
        int old_match = matches(self, action, old, NULL);
        if (old_match == UNSURE)
            return UNSURE;
        int new_match = matches(self, action, new, old);
        if (new_match == UNSURE || old_match != new_match)
            return UNSURE; /* unsure, or an UPDATE published as an INSERT or a DELETE */
        m = new_match;
    }
    return m == UNSURE ? UNSURE : m ? PASS : DROP;
}

PyDoc_STRVAR(verdict_doc,
"verdict(data) -> int\n--\n\n"
"PASS, DROP or UNSURE for the raw, non-streamed Insert, Update or Delete message ``data``\n"
"of this relation.");

static PyObject *RawFilter_verdict(RawFilter *self, PyObject *data) {
    if (self->source == NULL) {
        PyErr_SetString(PyExc_TypeError, "RawFilter.__init__ was not called");
        return NULL;
    }
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "verdict(): data must be bytes");
        return NULL;
    }
    Column stack_cols[2 * 64];
    Column *cols = stack_cols;
    if (self->ncols > 64) {
        cols = PyMem_Malloc(sizeof(Column) * 2 * (size_t)self->ncols);
        if (cols == NULL)
            return PyErr_NoMemory();
    }
    int v = decide(self, (const unsigned char *)PyBytes_AS_STRING(data),
                   (size_t)PyBytes_GET_SIZE(data), cols, cols + self->ncols);
    if (cols != stack_cols)
        PyMem_Free(cols);
    return PyLong_FromLong(v);
}

static void free_programs(RawFilter *self) {
    for (int a = 0; a < 3; a++) {
        if (self->programs[a] != NULL) {
            for (int k = 0; k < self->nprograms[a]; k++)
                PyMem_Free(self->programs[a][k].nodes);
            PyMem_Free(self->programs[a]);
        }
        self->programs[a] = NULL;
        self->nprograms[a] = 0;
    }
}

/* One program from its tuple of nodes; -1 with an error set. */
static int read_program(PyObject *nodes, Py_ssize_t ncols, Program *out) {
    /* at most 4096 nodes: rowfilter/raw.py's MAX_NODES */
    if (!PyTuple_Check(nodes) || PyTuple_GET_SIZE(nodes) == 0 || PyTuple_GET_SIZE(nodes) > 4096) {
        PyErr_SetString(PyExc_ValueError, "a program is a tuple of 1 to 4096 nodes");
        return -1;
    }
    int count = (int)PyTuple_GET_SIZE(nodes);
    out->count = count;
    out->nodes = PyMem_Calloc((size_t)count, sizeof(Node));
    if (out->nodes == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < count; i++) {
        Node *node = &out->nodes[i];
        const char *text = NULL;
        Py_ssize_t len = 0;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(nodes, i), "iiiLy#", &node->op, &node->a,
                              &node->b, &node->value, &text, &len))
            return -1;
        node->text = (const unsigned char *)text;
        node->len = (size_t)len;
        int op = node->op, unary = op == N_CAST || op == N_NOT || op >= N_IS_NULL;
        const char *why = NULL;
        if (op < 0 || op >= N_OPS)
            why = "unknown node";
        else if (op <= N_VAR_TEXT && (node->a < 0 || node->a >= ncols))
            why = "column out of range";
        else if (op >= N_ADD && (node->a < 0 || node->a >= i
                                 || (!unary && (node->b < 0 || node->b >= i))))
            why = "arguments must come before their node";
        else if ((op >= N_ADD && op <= N_CAST)
                 && node->value != 2 && node->value != 4 && node->value != 8)
            why = "an integer size is 2, 4 or 8";
        if (why != NULL) {
            PyErr_SetString(PyExc_ValueError, why);
            return -1;
        }
    }
    return 0;
}

static int RawFilter_init(RawFilter *self, PyObject *args, PyObject *kwargs) {
    if (self->source != NULL) {
        PyErr_SetString(PyExc_TypeError, "RawFilter.__init__ runs once: make a new RawFilter");
        return -1;
    }
    static char *kwlist[] = {"relid", "ncols", "actions", "programs", NULL};
    unsigned long relid;
    Py_ssize_t ncols;
    int actions;
    PyObject *programs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "kniO!:RawFilter", kwlist, &relid, &ncols,
                                     &actions, &PyTuple_Type, &programs))
        return -1;
    if (PyTuple_GET_SIZE(programs) != 3 || ncols < 0 || ncols > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError,
                        "programs: one entry per action (INSERT, UPDATE, DELETE); ncols < 65536");
        return -1;
    }
    for (int a = 0; a < 3; a++) {
        PyObject *ored = PyTuple_GET_ITEM(programs, a);
        if (ored == Py_None)
            continue;
        if (!PyTuple_Check(ored) || PyTuple_GET_SIZE(ored) == 0) {
            PyErr_SetString(PyExc_ValueError, "an action's programs: None or a non-empty tuple");
            goto error;
        }
        int n = (int)PyTuple_GET_SIZE(ored);
        self->programs[a] = PyMem_Calloc((size_t)n, sizeof(Program));
        if (self->programs[a] == NULL) {
            PyErr_NoMemory();
            goto error;
        }
        self->nprograms[a] = n;
        for (int k = 0; k < n; k++)
            if (read_program(PyTuple_GET_ITEM(ored, k), ncols, &self->programs[a][k]) < 0)
                goto error;
    }
    self->relid = (uint32_t)relid;
    self->ncols = ncols;
    self->actions = actions;
    self->source = Py_NewRef(programs);
    return 0;
error:
    free_programs(self);
    return -1;
}

static int RawFilter_traverse(RawFilter *self, visitproc visit, void *arg) {
    Py_VISIT(self->source);
    return 0;
}

static int RawFilter_clear(RawFilter *self) {
    Py_CLEAR(self->source);
    return 0;
}

static void RawFilter_dealloc(RawFilter *self) {
    PyObject_GC_UnTrack(self);
    free_programs(self);
    RawFilter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef RawFilter_methods[] = {
    {"verdict", (PyCFunction)RawFilter_verdict, METH_O, verdict_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(RawFilter_doc,
"RawFilter(relid, ncols, actions, programs)\n--\n\n"
"The row filters of relation ``relid`` (``ncols`` columns) on raw messages: ``actions``\n"
"(bits 0-2: INSERT, UPDATE, DELETE) those published, ``programs`` per action None (no\n"
"filter) or a tuple of ORed programs, each a tuple of nodes (op, a, b, value, text).");

static PyTypeObject RawFilter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "plugin_framework.rowfilter.native._rawfilter.RawFilter",
    .tp_basicsize = sizeof(RawFilter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = RawFilter_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RawFilter_init,
    .tp_dealloc = (destructor)RawFilter_dealloc,
    .tp_traverse = (traverseproc)RawFilter_traverse,
    .tp_clear = (inquiry)RawFilter_clear,
    .tp_methods = RawFilter_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "plugin_framework.rowfilter.native._rawfilter",
    .m_doc = "A relation's row filters decided on raw pgoutput row changes.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__rawfilter(void) {
    static const char *names[N_OPS] = {
        "VAR_INT", "VAR_BOOL", "VAR_TEXT", "CONST_INT", "CONST_BOOL", "CONST_TEXT",
        "CONST_NULL", "ADD", "SUB", "MUL", "DIV", "MOD", "CAST", "EQ", "NE", "LT", "LE", "GT",
        "GE", "TEXT_EQ", "TEXT_NE", "DISTINCT", "AND", "OR", "NOT", "IS_NULL", "IS_NOT_NULL",
        "IS_TRUE", "IS_NOT_TRUE", "IS_FALSE", "IS_NOT_FALSE"};
    if (PyType_Ready(&RawFilter_Type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RawFilter", (PyObject *)&RawFilter_Type) < 0
        || PyModule_AddIntConstant(m, "DROP", DROP) < 0
        || PyModule_AddIntConstant(m, "PASS", PASS) < 0
        || PyModule_AddIntConstant(m, "UNSURE", UNSURE) < 0)
        goto error;
    for (int i = 0; i < N_OPS; i++)
        if (PyModule_AddIntConstant(m, names[i], i) < 0)
            goto error;
    return m;
error:
    Py_DECREF(m);
    return NULL;
}
