"""What the tests share, imported as ``support.<module>`` (tests/conftest.py's directory,
tests/, is on sys.path): ``pgtest`` the server versions and cluster settings the tests run
on, and a throwaway database of a test cluster; ``workload`` the transactions that make the
server send every pgoutput message kind, and ``parity_workload`` the ones decoded by
test_decoding and wal2json beside pgdecode's emitters; ``capture`` raw pgoutput from a slot
through the SQL functions; ``streamkit`` streaming (running ``pgdecode`` and its probe
emitters, reading a slot through START_REPLICATION, watching a slot); ``recorders``
in-process plugins that record what they are given; ``scripted`` scripted pgoutput streams
for the server-free reorder tests; ``strategies`` hypothesis strategies for pgoutput
messages; ``native`` what the C fast-path tests share (relations, row changes, server-made
values, a pipeline run with the C code on or off); ``textparity`` the text emitter's lines
beside test_decoding's from the same WAL; ``jsonmirror`` tables rebuilt from the json
emitter's lines, and the server's own; ``snapshotkit`` the snapshot tests' tables, writer,
kills during the copy and checks; ``rowfilters`` a slot decoded through a publication with
row filters, and what a subscriber would hold; ``faultshim`` an fsync that fails on demand
(an LD_PRELOAD shim); ``spark_fixtures`` the Spark session fixture, Spark workloads and state
comparisons; ``mirror_workload`` the mirrors' random workload and its checks; ``sinkrows``
change rows for the state sinks made in Python; ``runners`` a script of this package run as
a process that a test kills. Run as scripts by path, in processes of their own:
``spark_fixtures`` (test_spark_recovery.py), ``merge_runner`` (test_spark_mergeinto.py),
``spark_prepared_runner`` (test_spark_prepared_kill.py) and ``debezium_runner``
(test_debezium.py).
"""
