"""The ``text`` emitter: contrib/test_decoding's output, from the pgoutput stream.

Every line is what PostgreSQL's test_decoding prints through ``pg_logical_slot_get_changes``
(or pg_recvlogical) for the same transactions, byte for byte, when the publication covers
all tables (``FOR ALL TABLES``, every action published) and pgoutput sends text-format values
and messages (``binary`` off, ``messages`` on)::

    BEGIN 741
    table public.items: INSERT: id[integer]:1 name[text]:'one' price[numeric]:9.50
    table public.items: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 ...
    table public.docs: UPDATE: id[integer]:1 body[text]:unchanged-toast-datum
    table public.a, public.b: TRUNCATE: restart_seqs cascade
    message: transactional: 1 prefix: audit, sz: 5 content:hello
    COMMIT 741 (at 2024-05-01 10:11:12.345678+00)
    PREPARE TRANSACTION 'gid-1', txid 742
    COMMIT PREPARED 'gid-1', txid 742
    opening a streamed block for transaction TXN 743
    streaming change for TXN 743
    closing a streamed block for transaction TXN 743
    committing streamed transaction TXN 743

Options are test_decoding's, with its names, defaults and error messages: ``include-xids``
(true), ``include-timestamp`` (false), ``skip-empty-xacts`` (false), ``only-local`` (false),
``include-rewrites`` (false), ``stream-changes`` (false), ``force-binary`` (false). As in C,
a valueless ``-o include-xids`` (likewise include-timestamp, skip-empty-xacts, only-local)
means true, while a valueless ``-o stream-changes`` (likewise force-binary, include-rewrites)
changes nothing. ``filter_prepare`` skips, like test_decoding, the prepared transactions
whose gid contains ``_nodecode``: they are printed as ordinary ones at COMMIT PREPARED.

Known differences (docs/emitters-text.md has the details):

- Empty transactions. test_decoding prints ``BEGIN``/``COMMIT`` for transactions with
  nothing to show (DDL, an autovacuum ANALYZE, a VACUUM FULL) unless ``skip-empty-xacts``;
  pgoutput (PostgreSQL 15 and later) never sends such transactions, so they are missing
  here. With ``skip-empty-xacts`` the outputs are the same. Likewise a stream block holding
  nothing printable is not reported.
- What pgoutput does not send cannot be printed: a DELETE without an old tuple (REPLICA
  IDENTITY NOTHING; test_decoding's ``DELETE: (no-tuple-data)``), table-rewrite changes
  (``include-rewrites`` is accepted and has no effect), generated columns unless the
  publication has ``publish_generated_columns = stored`` (PostgreSQL 18), and whatever row
  filters or column lists of the publication leave out.
- Type names. Built-in types are named by a port of ``format_type_be``. For other types
  pgoutput's Type message is not enough: a domain arrives under its base type's name and an
  array of a user type as ``_name``; they are looked up (once per type) with
  ``format_type`` through ``ctx.catalog`` when the pipeline has one, which names them as
  they are now rather than as they were when the change was made. Without a catalog, a
  ``_name`` is printed ``name[]`` and a domain as its base type.
- Identifiers are quoted as the server the stream comes from quotes them: the few names
  whose quoting changed between PostgreSQL 15 and 18 (``system_user``, ``json_table``,
  ``merge_action``...: keywords since 16 or 17) by that server's version, taken when one
  of them is met from ``ctx.server_version`` if the source set it, else through the
  catalog; without either (``pgdecode replay`` today), as 18 quotes them.
- ``include-timestamp`` prints times in the TimeZone of a session opened with the catalog's
  connection string (which is what the walsender of that connection would use), read once;
  without a catalog in ``$PGTZ``, else UTC.
- A transactional message with ``skip-empty-xacts`` opens the transaction (prints BEGIN, or
  the stream block's opening line) from PostgreSQL 17 on, not before: the server version
  is read as for quoting; without it, the newer behaviour.
- Column values are the server's text output, so they depend on the settings (DateStyle,
  IntervalStyle, extra_float_digits, bytea_output, TimeZone) of the session that decoded
  the pgoutput stream, exactly as test_decoding's depend on its own session's.
- A message whose content is not valid UTF-8 needs ``force-binary`` (test_decoding would
  return it as invalid text).

The modules: ``options`` (the option table), ``relation`` (how a table's rows print, made once
per Relation message), ``fast`` (the glue to the C formatter of row changes,
emitters/text/native/_textrow.c, made from what ``relation`` computes) and ``emitter`` (the
callbacks).
"""

from __future__ import annotations

from emitters.text.emitter import TestDecodingEmitter
from emitters.text.options import OPTIONS
from plugin_framework.pgtypes import quote_literal, timestamptz_to_str

__all__ = ["OPTIONS", "TestDecodingEmitter", "quote_literal", "timestamptz_to_str"]
