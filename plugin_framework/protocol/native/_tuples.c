/*
 * plugin_framework.protocol.native._tuples: pgoutput's TupleData read in C, the decoder's hot
 * spot.
 *
 * read_tuple(data, pos) mirrors protocol/tuples.py's read_tuple_py, the reference: it
 * returns (kinds, values, end), the same kinds bytes and values tuple the Python code builds
 * (None for null and unchanged-TOAST columns) and the offset past the tuple, or None for
 * anything malformed, which the Python code then reads again to raise the exact error.
 * tests/protocol/test_protocol_codec.py holds the two equal on valid and damaged bytes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define KIND_NULL 'n'
#define KIND_UNCHANGED_TOAST 'u'
#define KIND_TEXT 't'
#define KIND_BINARY 'b'

PyDoc_STRVAR(read_tuple_doc,
"read_tuple(data, pos) -> (kinds, values, end) | None\n--\n\n"
"The TupleData at ``pos`` of the bytes ``data``, or None when it is malformed.");

static PyObject *read_tuple(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "read_tuple() takes data (bytes) and pos");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    if (pos < 0 || size - pos < 2)
        Py_RETURN_NONE;
    Py_ssize_t ncols = ((Py_ssize_t)data[pos] << 8) | data[pos + 1];
    pos += 2;
    PyObject *kinds = PyBytes_FromStringAndSize(NULL, ncols);
    PyObject *values = PyTuple_New(ncols);
    if (kinds == NULL || values == NULL)
        goto error;
    char *kind_out = PyBytes_AS_STRING(kinds);
    for (Py_ssize_t i = 0; i < ncols; i++) {
        if (pos >= size)
            goto malformed;
        unsigned char kind = data[pos];
        kind_out[i] = (char)kind;
        if (kind == KIND_NULL || kind == KIND_UNCHANGED_TOAST) {
            pos += 1;
            PyTuple_SET_ITEM(values, i, Py_NewRef(Py_None));
        } else if (kind == KIND_TEXT || kind == KIND_BINARY) {
            if (size - pos < 5)
                goto malformed;
            uint32_t len = ((uint32_t)data[pos + 1] << 24) | ((uint32_t)data[pos + 2] << 16)
                         | ((uint32_t)data[pos + 3] << 8) | data[pos + 4];
            pos += 5;
            if ((size_t)len > (size_t)(size - pos))
                goto malformed;
            PyObject *value = PyBytes_FromStringAndSize((const char *)data + pos,
                                                        (Py_ssize_t)len);
            if (value == NULL)
                goto error;
            PyTuple_SET_ITEM(values, i, value);
            pos += len;
        } else {
            goto malformed;
        }
    }
    PyObject *end = PyLong_FromSsize_t(pos);
    if (end == NULL)
        goto error;
    PyObject *result = PyTuple_Pack(3, kinds, values, end);
    Py_DECREF(kinds);
    Py_DECREF(values);
    Py_DECREF(end);
    return result;
malformed:
    Py_DECREF(kinds);
    Py_DECREF(values);
    Py_RETURN_NONE;
error:
    Py_XDECREF(kinds);
    Py_XDECREF(values);
    return NULL;
}

static PyMethodDef methods[] = {
    {"read_tuple", (PyCFunction)(void (*)(void))read_tuple, METH_FASTCALL, read_tuple_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "plugin_framework.protocol.native._tuples",
    .m_doc = "pgoutput's TupleData read in C (the reference: protocol/tuples.py's read_tuple_py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__tuples(void) { return PyModule_Create(&module); }
