"""Built-in type OIDs and names: the one table of them (src/include/catalog/pg_type.dat).

The named constants are the types pgdecode refers to by number (the converters, format_type,
the row-filter analyzer); ``TYPNAMES`` names every type with a fixed OID, and
``ARRAY_ELEMENTS`` maps each true array type to its element type. tests/pgtypes/test_pgtypes.py
checks that each constant is the OID of the type it is named after, and
tests/pgtypes/test_format_type.py checks the tables against PostgreSQL 15 and 18.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ANY", "ANYARRAY", "ANYCOMPATIBLE", "ANYCOMPATIBLEARRAY", "ANYCOMPATIBLEMULTIRANGE",
    "ANYCOMPATIBLENONARRAY", "ANYCOMPATIBLERANGE", "ANYELEMENT", "ANYENUM", "ANYMULTIRANGE",
    "ANYNONARRAY", "ANYRANGE", "ARRAY_ELEMENTS", "BIT", "BOOL", "BOX", "BPCHAR", "BYTEA", "CHAR",
    "CID", "CIDR", "CIRCLE", "DATE", "DATEMULTIRANGE", "DATERANGE", "FLOAT4", "FLOAT8", "INET",
    "INT2", "INT4", "INT4MULTIRANGE", "INT4RANGE", "INT8", "INT8MULTIRANGE", "INT8RANGE",
    "INTERVAL", "JSON", "JSONB", "JSONPATH", "LINE", "LSEG", "MACADDR", "MACADDR8", "MONEY",
    "NAME", "NUMERIC", "NUMMULTIRANGE", "NUMRANGE", "OID", "PATH", "PG_LSN", "POINT", "POLYGON",
    "RECORD", "REFCURSOR", "TEXT", "TEXTARRAY", "TID", "TIME", "TIMESTAMP", "TIMESTAMPTZ",
    "TIMETZ", "TSMULTIRANGE", "TSQUERY", "TSRANGE", "TSTZMULTIRANGE", "TSTZRANGE", "TSVECTOR",
    "TYPNAMES", "UNKNOWN", "UUID", "VARBIT", "VARCHAR", "XID", "XID8", "XML",
]

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, TID, XID, CID = (
    16, 17, 18, 19, 20, 21, 23, 25, 26, 27, 28, 29)
JSON, XML, POINT, LSEG, PATH, BOX, POLYGON, LINE, CIDR = (
    114, 142, 600, 601, 602, 603, 604, 628, 650)
FLOAT4, FLOAT8, UNKNOWN, CIRCLE, MACADDR8, MONEY, MACADDR, INET = (
    700, 701, 705, 718, 774, 790, 829, 869)
TEXTARRAY = 1009
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = (
    1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266)
BIT, VARBIT, NUMERIC, REFCURSOR, UUID, PG_LSN, TSVECTOR, TSQUERY, JSONB, JSONPATH, XID8 = (
    1560, 1562, 1700, 1790, 2950, 3220, 3614, 3615, 3802, 4072, 5069)
INT4RANGE, NUMRANGE, TSRANGE, TSTZRANGE, DATERANGE, INT8RANGE = (
    3904, 3906, 3908, 3910, 3912, 3926)
INT4MULTIRANGE, NUMMULTIRANGE, TSMULTIRANGE, TSTZMULTIRANGE, DATEMULTIRANGE, INT8MULTIRANGE = (
    4451, 4532, 4533, 4534, 4535, 4536)

# Pseudo-types: a record, "any", and the polymorphic ones (the "anyelement" family and the
# "anycompatible" family).
RECORD, ANY = 2249, 2276
ANYELEMENT, ANYARRAY, ANYNONARRAY, ANYENUM, ANYRANGE, ANYMULTIRANGE = (
    2283, 2277, 2776, 3500, 3831, 4537)
ANYCOMPATIBLE, ANYCOMPATIBLEARRAY, ANYCOMPATIBLENONARRAY = 5077, 5078, 5079
ANYCOMPATIBLERANGE, ANYCOMPATIBLEMULTIRANGE = 5080, 4538

# pg_type.typname of every type with a fixed OID: src/include/catalog/pg_type.dat plus the
# row types of the catalogs that declare BKI_ROWTYPE_OID (identical in PostgreSQL 15 and 18).
# Types that initdb creates later (system views' row types, information_schema's domains,
# the arrays of catalog row types) get OIDs >= 10000 and reach us through Type messages.
TYPNAMES: Final[dict[int, str]] = {
    16: "bool", 17: "bytea", 18: "char", 19: "name", 20: "int8", 21: "int2", 22: "int2vector",
    23: "int4", 24: "regproc", 25: "text", 26: "oid", 27: "tid", 28: "xid", 29: "cid",
    30: "oidvector", 32: "pg_ddl_command", 71: "pg_type", 75: "pg_attribute", 81: "pg_proc",
    83: "pg_class", 114: "json", 142: "xml", 143: "_xml", 194: "pg_node_tree", 199: "_json",
    210: "_pg_type", 269: "table_am_handler", 270: "_pg_attribute", 271: "_xid8", 272: "_pg_proc",
    273: "_pg_class", 325: "index_am_handler", 600: "point", 601: "lseg", 602: "path", 603: "box",
    604: "polygon", 628: "line", 629: "_line", 650: "cidr", 651: "_cidr", 700: "float4",
    701: "float8", 705: "unknown", 718: "circle", 719: "_circle", 774: "macaddr8",
    775: "_macaddr8", 790: "money", 791: "_money", 829: "macaddr", 869: "inet", 1000: "_bool",
    1001: "_bytea", 1002: "_char", 1003: "_name", 1005: "_int2", 1006: "_int2vector",
    1007: "_int4", 1008: "_regproc", 1009: "_text", 1010: "_tid", 1011: "_xid", 1012: "_cid",
    1013: "_oidvector", 1014: "_bpchar", 1015: "_varchar", 1016: "_int8", 1017: "_point",
    1018: "_lseg", 1019: "_path", 1020: "_box", 1021: "_float4", 1022: "_float8", 1027: "_polygon",
    1028: "_oid", 1033: "aclitem", 1034: "_aclitem", 1040: "_macaddr", 1041: "_inet",
    1042: "bpchar", 1043: "varchar", 1082: "date", 1083: "time", 1114: "timestamp",
    1115: "_timestamp", 1182: "_date", 1183: "_time", 1184: "timestamptz", 1185: "_timestamptz",
    1186: "interval", 1187: "_interval", 1231: "_numeric", 1248: "pg_database", 1263: "_cstring",
    1266: "timetz", 1270: "_timetz", 1560: "bit", 1561: "_bit", 1562: "varbit", 1563: "_varbit",
    1700: "numeric", 1790: "refcursor", 2201: "_refcursor", 2202: "regprocedure", 2203: "regoper",
    2204: "regoperator", 2205: "regclass", 2206: "regtype", 2207: "_regprocedure",
    2208: "_regoper", 2209: "_regoperator", 2210: "_regclass", 2211: "_regtype", 2249: "record",
    2275: "cstring", 2276: "any", 2277: "anyarray", 2278: "void", 2279: "trigger",
    2280: "language_handler", 2281: "internal", 2283: "anyelement", 2287: "_record",
    2776: "anynonarray", 2842: "pg_authid", 2843: "pg_auth_members", 2949: "_txid_snapshot",
    2950: "uuid", 2951: "_uuid", 2970: "txid_snapshot", 3115: "fdw_handler", 3220: "pg_lsn",
    3221: "_pg_lsn", 3310: "tsm_handler", 3361: "pg_ndistinct", 3402: "pg_dependencies",
    3500: "anyenum", 3614: "tsvector", 3615: "tsquery", 3642: "gtsvector", 3643: "_tsvector",
    3644: "_gtsvector", 3645: "_tsquery", 3734: "regconfig", 3735: "_regconfig",
    3769: "regdictionary", 3770: "_regdictionary", 3802: "jsonb", 3807: "_jsonb", 3831: "anyrange",
    3838: "event_trigger", 3904: "int4range", 3905: "_int4range", 3906: "numrange",
    3907: "_numrange", 3908: "tsrange", 3909: "_tsrange", 3910: "tstzrange", 3911: "_tstzrange",
    3912: "daterange", 3913: "_daterange", 3926: "int8range", 3927: "_int8range",
    4066: "pg_shseclabel", 4072: "jsonpath", 4073: "_jsonpath", 4089: "regnamespace",
    4090: "_regnamespace", 4096: "regrole", 4097: "_regrole", 4191: "regcollation",
    4192: "_regcollation", 4451: "int4multirange", 4532: "nummultirange", 4533: "tsmultirange",
    4534: "tstzmultirange", 4535: "datemultirange", 4536: "int8multirange", 4537: "anymultirange",
    4538: "anycompatiblemultirange", 4600: "pg_brin_bloom_summary",
    4601: "pg_brin_minmax_multi_summary", 5017: "pg_mcv_list", 5038: "pg_snapshot",
    5039: "_pg_snapshot", 5069: "xid8", 5077: "anycompatible", 5078: "anycompatiblearray",
    5079: "anycompatiblenonarray", 5080: "anycompatiblerange", 6101: "pg_subscription",
    6150: "_int4multirange", 6151: "_nummultirange", 6152: "_tsmultirange",
    6153: "_tstzmultirange", 6155: "_datemultirange", 6157: "_int8multirange",
}

# The "true" array types (typsubscript array_subscript_handler, storage not plain): array OID
# -> element OID. format_type prints these as the element's name followed by "[]", applying
# the typmod to the element. int2vector and oidvector (plain storage) and the fixed-length
# pseudo-arrays (name, point, ...) keep their own names.
ARRAY_ELEMENTS: Final[dict[int, int]] = {
    143: 142, 199: 114, 210: 71, 270: 75, 271: 5069, 272: 81, 273: 83, 629: 628, 651: 650,
    719: 718, 775: 774, 791: 790, 1000: 16, 1001: 17, 1002: 18, 1003: 19, 1005: 21, 1006: 22,
    1007: 23, 1008: 24, 1009: 25, 1010: 27, 1011: 28, 1012: 29, 1013: 30, 1014: 1042, 1015: 1043,
    1016: 20, 1017: 600, 1018: 601, 1019: 602, 1020: 603, 1021: 700, 1022: 701, 1027: 604,
    1028: 26, 1034: 1033, 1040: 829, 1041: 869, 1115: 1114, 1182: 1082, 1183: 1083, 1185: 1184,
    1187: 1186, 1231: 1700, 1263: 2275, 1270: 1266, 1561: 1560, 1563: 1562, 2201: 1790, 2207: 2202,
    2208: 2203, 2209: 2204, 2210: 2205, 2211: 2206, 2287: 2249, 2949: 2970, 2951: 2950, 3221: 3220,
    3643: 3614, 3644: 3642, 3645: 3615, 3735: 3734, 3770: 3769, 3807: 3802, 3905: 3904, 3907: 3906,
    3909: 3908, 3911: 3910, 3913: 3912, 3927: 3926, 4073: 4072, 4090: 4089, 4097: 4096, 4192: 4191,
    5039: 5038, 6150: 4451, 6151: 4532, 6152: 4533, 6153: 4534, 6155: 4535, 6157: 4536,
}
