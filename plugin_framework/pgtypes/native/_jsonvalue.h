/*
 * _jsonvalue.h: PostgreSQL values as JSON, straight from their text in a pgoutput tuple:
 * the C mirror of the text converters that plugin_framework/pgtypes/converters.py marks in
 * NATIVE_KIND (each such converter's values, as orjson writes them), and a tuple as a JSON
 * object of them. The json emitter's fast path (emitters/json/native/_jsonrow.c) and the Spark change
 * builder's (plugin_framework/spark/changes/native/_changerows.c) both include it, so a type has one
 * definition of its JSON here as it has one converter in Python.
 *
 * A value outside the common forms of its type DEFERs to the column's Python converter and
 * orjson, one value at a time; invalid UTF-8 in a string DEFERs the whole row (Python raises
 * the decode error). The JSON written here must match orjson byte for byte: strings escape
 * '"', '\\' and the control characters below 0x20 only (\b \t \n \f \r, else \u00xx in
 * lower-case hex), and keep every other character, non-ASCII included, as UTF-8.
 *
 * Static functions only: each extension module includes its own copy.
 */

#ifndef PGDECODE_JSONVALUE_H
#define PGDECODE_JSONVALUE_H

#include "_pgrow.h" /* the output buffer and TupleData reading */

/* How a column's text becomes its JSON value: one code per text converter that declares it
 * in plugin_framework/pgtypes/converters.py (NATIVE_KIND, by these names, which the modules
 * export with json_add_codes); tests/emitters/test_json_native.py holds each code to its
 * converter. */
enum {
    C_PYCALL,       /* any other converter: call it, then orjson.dumps the result */
    C_VERBATIM,     /* orjson.Fragment: the text is the JSON value (integers, jsonb) */
    C_STRING,       /* bytes.decode: a JSON string */
    C_FLOAT,        /* t_float: finite values verbatim (-0 as -0.0), NaN and infinities as
                       strings */
    C_BOOL,         /* t_bool: "t" / "f" */
    C_JSON,         /* t_json: verbatim, line breaks as spaces */
    C_TIMESTAMP,    /* t_timestamp: ISO 8601 ("T" between date and time) */
    C_TIMESTAMPTZ,  /* t_timestamptz: the same, with a "+hh" offset as "+hh:00" */
    C_ARRAY_TEXT,   /* TEXT_ARRAY, psycopg's text[] loader: nested lists of strings */
    C_ARRAY_INT,    /* INTEGER_ARRAY, psycopg's bigint[] loader: nested lists of integers */
    C_ARRAY_BOOL,   /* BOOL_ARRAY, psycopg's boolean[] loader: nested lists of booleans */
    C_CODES
};

#define MAX_ARRAY_DEPTH 6 /* PostgreSQL's MAXDIM */

/* --- JSON strings ------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at s (as Python's strict decoder accepts it:
 * no overlong forms, no surrogates, nothing past U+10FFFF), or 0. */
static size_t utf8_sequence(const unsigned char *s, const unsigned char *end) {
    unsigned char c = s[0];
    size_t n = (size_t)(end - s);
    if (c >= 0xC2 && c <= 0xDF)
        return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if (c == 0xE0 && s[1] < 0xA0)
            return 0; /* overlong */
        if (c == 0xED && s[1] > 0x9F)
            return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && s[1] < 0x90)
            return 0; /* overlong */
        if (c == 0xF4 && s[1] > 0x8F)
            return 0; /* past U+10FFFF */
        return 4;
    }
    return 0;
}

/* Where the run at s of bytes that a JSON string keeps as they are and that need no UTF-8
 * check ends: the first byte below 0x20, from 0x80, '"' or '\\' (or end). Eight bytes at a
 * time while none of them is one (long text values are mostly such runs), then byte by
 * byte: the word test only says whether a word holds one, never where. */
static const unsigned char *plain_run_end(const unsigned char *s, const unsigned char *end) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while ((size_t)(end - s) >= 8) {
        uint64_t x, quote, backslash;
        memcpy(&x, s, 8);
        quote = x ^ (ones * '"');
        backslash = x ^ (ones * '\\');
        /* (v - ones * k) & ~v has a byte's high bit set where a byte of v is below k (k at
         * most 0x80; exact as a test of the whole word, which is all it is used for): a
         * byte below 0x20, or zero once XORed with the quote or the backslash; x itself
         * has one where a byte is from 0x80 */
        if ((((x - ones * 0x20) & ~x) | ((quote - ones) & ~quote)
             | ((backslash - ones) & ~backslash) | x) & highs)
            break;
        s += 8;
    }
    while (s < end && *s >= 0x20 && *s < 0x80 && *s != '"' && *s != '\\')
        s++;
    return s;
}

/* s as a JSON string; DEFER if it is not valid UTF-8 (Python then raises the decode error). */
static int put_string(Buf *b, const unsigned char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *end = s + n;
    TRY(put_byte(b, '"'));
    while (s < end) {
        /* the run kept as it is: plain bytes and well-formed UTF-8 sequences */
        const unsigned char *run = s;
        for (s = plain_run_end(s, end); s < end && *s >= 0x80; s = plain_run_end(s, end)) {
            size_t len = utf8_sequence(s, end);
            if (len == 0)
                return DEFER;
            s += len;
        }
        TRY(put(b, run, (size_t)(s - run)));
        if (s == end)
            break;
        unsigned char c = *s; /* below 0x20, '"' or '\\': escaped */
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
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
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
        }
        TRY(put(b, esc, len));
        s++;
    }
    return put_byte(b, '"');
}

/* --- the values of the other common types -------------------------------------------------- */

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int is_ascii(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80)
            return 0;
    return 1;
}

/* json's text with CR and LF as spaces (whitespace between tokens: the value is the same). */
static int put_json(Buf *b, const unsigned char *s, size_t n) {
    size_t start = b->len;
    TRY(put(b, s, n));
    for (size_t i = start; i < b->len; i++)
        if (b->p[i] == '\n' || b->p[i] == '\r')
            b->p[i] = ' ';
    return OK;
}

/* The common ISO DateStyle text of a timestamp of a year AD, with "T" for the space after
 * the date: "2024-01-02 03:04:05+02" -> "2024-01-02T03:04:05+02:00" (with_zone). DEFER for
 * any other text (infinity, BC, other DateStyles): Python's converter knows those. */
static int put_timestamp(Buf *b, const unsigned char *s, size_t n, int with_zone) {
    if (n < 11 || s[4] != '-' || s[10] != ' ' || s[n - 1] == 'C' || !is_ascii(s, n))
        return DEFER;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '"' || s[i] == '\\' || s[i] < 0x20 || (i < 10 && s[i] == ' '))
            return DEFER; /* Python replaces the first space: let it, where that differs */
    TRY(put_byte(b, '"'));
    TRY(put(b, s, 10));
    TRY(put_byte(b, 'T'));
    TRY(put(b, s + 11, n - 11));
    if (with_zone && (s[n - 3] == '+' || s[n - 3] == '-'))
        TRY(PUT_LITERAL(b, ":00"));
    return put_byte(b, '"');
}

/* An integer as the server prints one, which is how orjson prints it as a Python int:
 * an optional '-', then digits without a leading zero; few enough digits for 64 bits. */
static int plain_integer(const unsigned char *s, size_t n) {
    size_t i = (n > 0 && s[0] == '-') ? 1 : 0;
    if (i == n || n - i > 18)
        return 0;
    if (s[i] == '0' && (n - i > 1 || i == 1))
        return 0; /* "007", "-0" */
    for (; i < n; i++)
        if (!is_digit(s[i]))
            return 0;
    return 1;
}

/* One array element of a C_ARRAY_* column. */
static int put_element(Buf *b, int code, const unsigned char *s, size_t n, int quoted) {
    if (code == C_ARRAY_TEXT)
        return put_string(b, s, n);
    if (quoted)
        return DEFER; /* the server never quotes integers or booleans */
    if (code == C_ARRAY_INT)
        return plain_integer(s, n) ? put(b, s, n) : DEFER;
    if (n == 1 && s[0] == 't')
        return PUT_LITERAL(b, "true");
    if (n == 1 && s[0] == 'f')
        return PUT_LITERAL(b, "false");
    return DEFER;
}

/* An array's text ("{a,NULL,\"b c\"}", "{{1,2},{3,4}}") as nested JSON arrays, as psycopg's
 * loaders read it. Only the forms the server writes are taken here; anything else (bounds
 * like "[0:1]=", blanks around elements, a delimiter other than the comma) is DEFERred. */
static int put_array(Buf *b, int code, const unsigned char *s, size_t n) {
    const unsigned char *p = s, *end = s + n;
    int depth = 0;
    Buf unescaped;
    int rc = DEFER;
    buf_init(&unescaped);

    if (p == end || *p != '{')
        goto done;
    for (;;) {
        /* at the start of an array ('{') or of an element after a ',' */
        if (*p == '{') {
            if (++depth > MAX_ARRAY_DEPTH)
                goto done;
            if ((rc = put_byte(b, '[')) != OK)
                goto done;
            rc = DEFER;
            p++;
            if (p == end)
                goto done;
            if (*p == '}')
                goto close; /* an empty array */
            continue;
        }
        if (*p == '"') {
            unescaped.len = 0;
            for (p++;; p++) {
                if (p == end)
                    goto done;
                if (*p == '"')
                    break;
                if (*p == '\\' && ++p == end)
                    goto done;
                if ((rc = put_byte(&unescaped, (char)*p)) != OK)
                    goto done;
                rc = DEFER;
            }
            p++;
            if ((rc = put_element(b, code, (const unsigned char *)unescaped.p, unescaped.len,
                                  1)) != OK)
                goto done;
            rc = DEFER;
        } else {
            const unsigned char *token = p;
            while (p < end && *p != ',' && *p != '}') {
                unsigned char c = *p;
                if (c == '"' || c == '\\' || c == '{' || c == ' ' || (c >= '\t' && c <= '\r'))
                    goto done;
                p++;
            }
            size_t len = (size_t)(p - token);
            if (len == 0)
                goto done;
            if (len == 4 && memcmp(token, "NULL", 4) == 0)
                rc = PUT_LITERAL(b, "null");
            else
                rc = put_element(b, code, token, len, 0);
            if (rc != OK)
                goto done;
            rc = DEFER;
        }
        /* after an element: ',' and the next one, or the end of one or more arrays */
        for (;;) {
            if (p == end)
                goto done;
            if (*p == ',') {
                if ((rc = put_byte(b, ',')) != OK)
                    goto done;
                rc = DEFER;
                p++;
                if (p == end)
                    goto done;
                break;
            }
            if (*p != '}')
                goto done;
        close:
            if ((rc = put_byte(b, ']')) != OK)
                goto done;
            rc = DEFER;
            p++;
            if (--depth == 0) {
                rc = p == end ? OK : DEFER;
                goto done;
            }
        }
    }
done:
    buf_free(&unescaped);
    return rc;
}

/* --- a relation's columns as JSON ---------------------------------------------------------- */

typedef struct {
    Py_ssize_t ncols;
    PyObject *names;      /* per column: its name as a JSON string, quotes included */
    PyObject *converters; /* per column: its Python converter */
    PyObject *dumps;      /* orjson.dumps */
    unsigned char *codes; /* per column: C_* */
    Py_ssize_t *key_idx;  /* the replica identity columns */
    Py_ssize_t nkeys;
} JsonColumns;

static int put_value(const JsonColumns *self, Buf *b, Py_ssize_t i, const Column *col) {
    const unsigned char *s = col->value;
    size_t n = col->len;
    int rc;
    switch (self->codes[i]) {
    case C_VERBATIM:
        return put(b, s, n);
    case C_STRING:
        return put_string(b, s, n);
    case C_FLOAT:
        if (n == 2 && s[0] == '-' && s[1] == '0')
            return PUT_LITERAL(b, "-0.0"); /* JSON readers take -0 for the integer 0 */
        if (n > 0 && is_digit(s[n - 1]))
            return put(b, s, n);
        rc = DEFER; /* NaN, Infinity: strings, through Python */
        break;
    case C_BOOL:
        if (n == 1 && s[0] == 't')
            return PUT_LITERAL(b, "true");
        if (n == 1 && s[0] == 'f')
            return PUT_LITERAL(b, "false");
        rc = DEFER;
        break;
    case C_JSON:
        return put_json(b, s, n);
    case C_TIMESTAMP:
    case C_TIMESTAMPTZ: {
        size_t mark = b->len;
        rc = put_timestamp(b, s, n, self->codes[i] == C_TIMESTAMPTZ);
        if (rc == DEFER)
            b->len = mark;
        break;
    }
    case C_ARRAY_TEXT:
    case C_ARRAY_INT:
    case C_ARRAY_BOOL: {
        size_t mark = b->len;
        rc = put_array(b, self->codes[i], s, n);
        if (rc == DEFER)
            b->len = mark;
        break;
    }
    default:
        rc = DEFER;
    }
    if (rc != DEFER)
        return rc;
    /* Through the column's own converter and orjson: exact for every value. An Exception
     * there is Python's to raise again, from the change callback. */
    PyObject *raw = PyBytes_FromStringAndSize((const char *)s, (Py_ssize_t)n);
    if (raw == NULL)
        return FAIL;
    PyObject *value = PyObject_CallOneArg(PyTuple_GET_ITEM(self->converters, i), raw);
    Py_DECREF(raw);
    PyObject *json = NULL;
    if (value != NULL) {
        json = PyObject_CallOneArg(self->dumps, value);
        Py_DECREF(value);
    }
    if (json == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return FAIL;
        PyErr_Clear();
        return DEFER;
    }
    if (!PyBytes_Check(json)) {
        Py_DECREF(json);
        return DEFER;
    }
    rc = put(b, PyBytes_AS_STRING(json), (size_t)PyBytes_GET_SIZE(json));
    Py_DECREF(json);
    return rc;
}

static int put_name(const JsonColumns *self, Buf *b, Py_ssize_t i) {
    PyObject *name = PyTuple_GET_ITEM(self->names, i);
    return put(b, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
}

/* A tuple as a JSON object of the columns `which` (all when NULL), leaving out unchanged TOAST
 * columns; their names go to toast[*ntoast]. */
static int put_row(const JsonColumns *self, Buf *b, const Column *cols, const Py_ssize_t *which,
                   Py_ssize_t count, Py_ssize_t *toast, Py_ssize_t *ntoast) {
    int first = 1;
    *ntoast = 0;
    TRY(put_byte(b, '{'));
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t i = which == NULL ? k : which[k];
        const Column *col = &cols[i];
        if (col->kind == PGOUTPUT_TUPLE_UNCHANGED_TOAST) {
            toast[(*ntoast)++] = i;
            continue;
        }
        if (!first)
            TRY(put_byte(b, ','));
        first = 0;
        TRY(put_name(self, b, i));
        TRY(put_byte(b, ':'));
        if (col->kind == PGOUTPUT_TUPLE_NULL)
            TRY(PUT_LITERAL(b, "null"));
        else
            TRY(put_value(self, b, i, col));
    }
    return put_byte(b, '}');
}

static inline int put_names(const JsonColumns *self, Buf *b, const Py_ssize_t *which,
                            Py_ssize_t count) {
    TRY(put_byte(b, '['));
    for (Py_ssize_t k = 0; k < count; k++) {
        if (k > 0)
            TRY(put_byte(b, ','));
        TRY(put_name(self, b, which[k]));
    }
    return put_byte(b, ']');
}

/* Set up from a constructor's arguments: names (bytes: JSON strings), codes (one C_* per
 * column), converters, key_idx (column indexes) and dumps. -1 with an error set. */
static int json_columns_set(JsonColumns *self, PyObject *names, const Py_buffer *codes,
                            PyObject *converters, PyObject *key_idx, PyObject *dumps) {
    Py_ssize_t ncols = PyTuple_GET_SIZE(names);
    const char *why = NULL;
    if (codes->len != ncols || PyTuple_GET_SIZE(converters) != ncols)
        why = "names, codes and converters must have one entry per column";
    for (Py_ssize_t i = 0; why == NULL && i < ncols; i++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, i)))
            why = "names must be bytes";
        else if (((unsigned char *)codes->buf)[i] >= C_CODES)
            why = "unknown column code";
        else if (!PyCallable_Check(PyTuple_GET_ITEM(converters, i)))
            why = "converters must be callable";
    }
    if (why != NULL) {
        PyErr_SetString(PyExc_ValueError, why);
        return -1;
    }
    Py_ssize_t nkeys = PyTuple_GET_SIZE(key_idx);
    unsigned char *code_copy = PyMem_Malloc((size_t)ncols + 1);
    Py_ssize_t *keys = PyMem_Malloc(sizeof(Py_ssize_t) * ((size_t)nkeys + 1));
    if (code_copy == NULL || keys == NULL) {
        PyMem_Free(code_copy);
        PyMem_Free(keys);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(code_copy, codes->buf, (size_t)ncols);
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(key_idx, k));
        if (i < 0 || i >= ncols) {
            PyMem_Free(code_copy);
            PyMem_Free(keys);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "key_idx out of range");
            return -1;
        }
        keys[k] = i;
    }
    PyMem_Free(self->codes);
    PyMem_Free(self->key_idx);
    self->codes = code_copy;
    self->key_idx = keys;
    self->nkeys = nkeys;
    self->ncols = ncols;
    Py_XSETREF(self->names, Py_NewRef(names));
    Py_XSETREF(self->converters, Py_NewRef(converters));
    Py_XSETREF(self->dumps, Py_NewRef(dumps));
    return 0;
}

static int json_columns_traverse(JsonColumns *self, visitproc visit, void *arg) {
    Py_VISIT(self->names);
    Py_VISIT(self->converters);
    Py_VISIT(self->dumps);
    return 0;
}

static void json_columns_clear(JsonColumns *self) {
    Py_CLEAR(self->names);
    Py_CLEAR(self->converters);
    Py_CLEAR(self->dumps);
}

static void json_columns_free(JsonColumns *self) {
    json_columns_clear(self);
    PyMem_Free(self->codes);
    PyMem_Free(self->key_idx);
    self->codes = NULL;
    self->key_idx = NULL;
}

/* The module constants PYCALL, VERBATIM, ...: NATIVE_KIND's names for the C_* codes. */
static int json_add_codes(PyObject *module) {
    static const char *code_names[C_CODES] = {
        "PYCALL", "VERBATIM", "STRING", "FLOAT", "BOOL", "JSON",
        "TIMESTAMP", "TIMESTAMPTZ", "ARRAY_TEXT", "ARRAY_INT", "ARRAY_BOOL",
    };
    for (int i = 0; i < C_CODES; i++)
        if (PyModule_AddIntConstant(module, code_names[i], i) < 0)
            return -1;
    return 0;
}

#endif /* PGDECODE_JSONVALUE_H */
