/*
 * plugin_framework.sources.native._copyrow: one row of COPY ... TO STDOUT (text format) as the
 * pgoutput Insert message the stream would carry for it.
 *
 * The initial snapshot's fast path (sources/snapshot.py). Its reference is the Python path
 * beside it: psycopg's COPY parser (Copy.rows()) and the protocol encoder
 * (encode(Insert(...))); tests/sources/test_snapshot.py holds the two byte-equal on rows a real
 * server copies out, and tests/sources/test_copyrow.py holds the conversion to the format below on
 * any bytes. The text format (PostgreSQL's CopyReadAttributesText): fields separated
 * by a tab, the row ended by a newline, \N alone for NULL, and backslash escapes: \b \f \n \r
 * \t \v, one to three octal digits, x and one or two hex digits, any other character itself.
 *
 * read_messages reads the rows from libpq itself, with the GIL released, so that the copy
 * thread's reading and conversion run beside the pipeline's formatting instead of taking
 * turns with it. Its reference is sources/snapshot.py's copy_out loop (psycopg.pq's
 * get_copy_data, then insert_message): the same libpq calls, in the same order. libpq is the
 * library psycopg loaded, whose functions sources/libpq.py binds (bind_libpq).
 *
 * read_copy_data reads the replication stream's messages in the same way (no waiting, no
 * conversion): sources/replication.py's read_batch.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Each field grows by at most 5 bytes (kind and length) and never by unescaping. */
static Py_ssize_t message_bound(Py_ssize_t headlen, Py_ssize_t rowlen, int ncols) {
    return headlen + rowlen + 5 * (Py_ssize_t)ncols + 5;
}

/* The Insert message of the COPY text row p[0..len) (its newline optional) into o, which
 * holds message_bound(headlen, len, ncols) bytes: its length, or -1 when the row does not
 * have ncols fields (*fields says how many it has). Touches no Python object. */
static Py_ssize_t write_message(const char *head, Py_ssize_t headlen, int ncols,
                                const char *p, Py_ssize_t len, char *o, int *fields_out) {
    const char *end = p + len;
    if (end > p && end[-1] == '\n') end--;
    memcpy(o, head, headlen);
    char *w = o + headlen;
    int fields = 0;
    for (;;) {
        const char *f = p;
        const char *tab = memchr(p, '\t', (size_t)(end - p));
        p = tab != NULL ? tab : end;
        if (++fields > ncols) break;
        if (p - f == 2 && f[0] == '\\' && f[1] == 'N') {
            *w++ = 'n';
        } else {
            char *kind = w;
            *kind = 't';
            char *v = w + 5, *start = v;
            const char *s = f;
            while (s < p) {
                /* the run up to the next backslash as it is, then the escape */
                const char *slash = memchr(s, '\\', (size_t)(p - s));
                const char *stop = slash != NULL ? slash : p;
                memcpy(v, s, (size_t)(stop - s));
                v += stop - s;
                s = stop;
                if (s >= p) break;
                if (s + 1 >= p) {  /* a backslash that ends the field: itself */
                    *v++ = '\\';
                    break;
                }
                char c = *++s;
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
                s++;
            }
            uint32_t n = (uint32_t)(v - start);
            kind[1] = (char)(n >> 24); kind[2] = (char)(n >> 16);
            kind[3] = (char)(n >> 8); kind[4] = (char)n;
            w = v;
        }
        if (p >= end) break;
        p++; /* the tab */
    }
    *fields_out = fields;
    return fields == ncols ? w - o : -1;
}

static PyObject *wrong_fields(int fields, int ncols) {
    return PyErr_Format(PyExc_ValueError, "a COPY row of %d fields for a table of %d columns",
                        fields, ncols);
}

/* insert_message(head, ncols, row) -> bytes: head is b"I" + relation id + b"N" + ncols (the
 * message's fixed part), row one COPY text row (its newline optional). ValueError when the
 * row does not have ncols fields. */
static PyObject *insert_message(PyObject *self, PyObject *args) {
    Py_buffer head, row;
    int ncols, fields;
    if (!PyArg_ParseTuple(args, "y*iy*", &head, &ncols, &row))
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, message_bound(head.len, row.len, ncols));
    if (out != NULL) {
        Py_ssize_t n = write_message(head.buf, head.len, ncols, row.buf, row.len,
                                     PyBytes_AS_STRING(out), &fields);
        if (n < 0) {
            Py_CLEAR(out);
            wrong_fields(fields, ncols);
        } else {
            _PyBytes_Resize(&out, n);
        }
    }
    PyBuffer_Release(&head);
    PyBuffer_Release(&row);
    return out;
}

/* libpq's functions, as psycopg's copy of libpq has them (bind_libpq): the PGconn is
 * psycopg's, so only that library may touch it. */
typedef int (*get_copy_data_fn)(void *conn, char **buffer, int async);
typedef int (*consume_input_fn)(void *conn);
typedef void (*freemem_fn)(void *ptr);
typedef int (*socket_fn)(const void *conn);
static get_copy_data_fn pq_get_copy_data;
static consume_input_fn pq_consume_input;
static freemem_fn pq_freemem;
static socket_fn pq_socket;

/* bind_libpq(PQgetCopyData, PQconsumeInput, PQfreemem, PQsocket): the functions' addresses */
static PyObject *bind_libpq(PyObject *self, PyObject *args) {
    unsigned long long get, consume, freemem, sock;
    if (!PyArg_ParseTuple(args, "KKKK", &get, &consume, &freemem, &sock))
        return NULL;
    if (!get || !consume || !freemem || !sock) {
        PyErr_SetString(PyExc_ValueError, "bind_libpq: a function address is 0");
        return NULL;
    }
    pq_get_copy_data = (get_copy_data_fn)(uintptr_t)get;
    pq_consume_input = (consume_input_fn)(uintptr_t)consume;
    pq_freemem = (freemem_fn)(uintptr_t)freemem;
    pq_socket = (socket_fn)(uintptr_t)sock;
    Py_RETURN_NONE;
}

/* read_messages(head, ncols, pgconn_ptr, max_rows) -> (messages, status): the Insert
 * messages of the next rows of the COPY ... TO STDOUT under way on the connection, up to
 * max_rows; status 1 when max_rows were read (more may follow), -1 when the COPY is over,
 * -2 when libpq failed (its result says why). As copy_out's loop: PQgetCopyData, and when
 * no whole row is buffered, wait for the socket and PQconsumeInput. ValueError when a row
 * does not have ncols fields (the rows before it are dropped). */
static PyObject *read_messages(PyObject *self, PyObject *args) {
    unsigned long long ptr;
    Py_buffer head;
    int ncols;
    Py_ssize_t max_rows;
    if (!PyArg_ParseTuple(args, "y*iKn", &head, &ncols, &ptr, &max_rows))
        return NULL;
    if (pq_get_copy_data == NULL || ptr == 0 || max_rows < 1) {
        PyBuffer_Release(&head);
        PyErr_SetString(PyExc_ValueError,
                        pq_get_copy_data == NULL ? "read_messages: libpq is not bound"
                                                 : "read_messages: bad connection or count");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)ptr;
    /* The messages, end to end, in one arena; ends[i] is where message i ends. */
    Py_ssize_t *ends = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)max_rows);
    Py_ssize_t cap = 1 << 16, used = 0, count = 0;
    char *arena = PyMem_RawMalloc((size_t)cap);
    int status = 1, fields = 0, bad = 0, oom = 0, wait_error = 0;
    if (ends == NULL || arena == NULL) {
        PyMem_RawFree(ends);
        PyMem_RawFree(arena);
        PyBuffer_Release(&head);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    while (count < max_rows) {
        char *row = NULL;
        int n = pq_get_copy_data(conn, &row, 1);
        if (n > 0) {
            Py_ssize_t need = used + message_bound(head.len, n, ncols);
            if (need > cap) {
                Py_ssize_t grown = cap;
                while (grown < need) grown *= 2;
                char *more = PyMem_RawRealloc(arena, (size_t)grown);
                if (more == NULL) {
                    pq_freemem(row);
                    oom = 1;
                    break;
                }
                arena = more;
                cap = grown;
            }
            Py_ssize_t len = write_message(head.buf, head.len, ncols, row, n, arena + used,
                                           &fields);
            pq_freemem(row);
            if (len < 0) {
                bad = 1;
                break;
            }
            used += len;
            ends[count++] = used;
        } else if (n == 0) {  /* no whole row buffered: wait for the server */
            struct pollfd pfd = {pq_socket(conn), POLLIN, 0};
            int r;
            if (pfd.fd < 0) {  /* the connection is gone: libpq's error says why */
                status = -2;
                break;
            }
            do {
                r = poll(&pfd, 1, -1);
            } while (r < 0 && errno == EINTR);
            if (r < 0) {
                wait_error = errno;
                break;
            }
            if (!pq_consume_input(conn)) {
                status = -2;
                break;
            }
        } else {  /* -1: the COPY is over; -2: libpq failed */
            status = n;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&head);
    PyObject *list = NULL, *result = NULL;
    if (oom) {
        PyErr_NoMemory();
    } else if (bad) {
        wrong_fields(fields, ncols);
    } else if (wait_error) {
        errno = wait_error;
        PyErr_SetFromErrno(PyExc_OSError);
    } else if ((list = PyList_New(count)) != NULL) {
        Py_ssize_t start = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *message = PyBytes_FromStringAndSize(arena + start, ends[i] - start);
            if (message == NULL) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, i, message);
            start = ends[i];
        }
        if (list != NULL)
            result = Py_BuildValue("(Ni)", list, status);
    }
    PyMem_RawFree(ends);
    PyMem_RawFree(arena);
    return result;
}

/* read_copy_data(pgconn_ptr, max_messages) -> (messages, status): the CopyData messages of
 * the COPY under way that libpq has buffered whole now, up to max_messages, as bytes; never
 * waits. status 1 when max_messages were read (more may be buffered), 0 when no more is
 * buffered, -1 when the COPY is over, -2 when libpq failed (its result says why). The
 * replication stream's read (sources/replication.py's read_batch) without a trip through
 * Python per message; its reference is that loop's psycopg.pq get_copy_data(1) calls, the
 * same libpq calls in the same order. */
static PyObject *read_copy_data(PyObject *self, PyObject *args) {
    unsigned long long ptr;
    Py_ssize_t max_messages;
    if (!PyArg_ParseTuple(args, "Kn", &ptr, &max_messages))
        return NULL;
    if (pq_get_copy_data == NULL || ptr == 0 || max_messages < 1) {
        PyErr_SetString(PyExc_ValueError,
                        pq_get_copy_data == NULL ? "read_copy_data: libpq is not bound"
                                                 : "read_copy_data: bad connection or count");
        return NULL;
    }
    void *conn = (void *)(uintptr_t)ptr;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    int status = 1;
    while (PyList_GET_SIZE(list) < max_messages) {
        char *buffer = NULL;
        int n = pq_get_copy_data(conn, &buffer, 1);
        if (n <= 0) {  /* 0: none buffered whole; -1: the COPY is over; -2: libpq failed */
            status = n;
            break;
        }
        PyObject *message = PyBytes_FromStringAndSize(buffer, n);
        pq_freemem(buffer);
        if (message == NULL || PyList_Append(list, message) < 0) {
            Py_XDECREF(message);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(message);
    }
    return Py_BuildValue("(Ni)", list, status);
}

static PyMethodDef methods[] = {
    {"insert_message", insert_message, METH_VARARGS,
     "insert_message(head, ncols, row) -> the pgoutput Insert message of one COPY text row"},
    {"bind_libpq", bind_libpq, METH_VARARGS,
     "bind_libpq(get_copy_data, consume_input, freemem, socket): libpq's function addresses"},
    {"read_messages", read_messages, METH_VARARGS,
     "read_messages(head, ncols, pgconn_ptr, max_rows) -> (Insert messages, status)"},
    {"read_copy_data", read_copy_data, METH_VARARGS,
     "read_copy_data(pgconn_ptr, max_messages) -> (CopyData messages buffered now, status)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_copyrow", "COPY text rows as pgoutput Insert messages.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__copyrow(void) { return PyModule_Create(&module); }
