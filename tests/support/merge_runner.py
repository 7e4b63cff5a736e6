"""A pipeline into MergeIntoWriter, in a process that tests/spark/test_spark_mergeinto.py kills:

    PYTHONPATH=tests python tests/support/merge_runner.py --dsn ... --slot ... --work DIR \\
        --jar ROWLEVEL_JAR [--endpos LSN] [--kill-from BATCH] [--max-rows N]

The targets are tables of tests/java/RowLevelCatalog.java kept in DIR/tables (they outlive
the process). With ``--kill-from N``, once a batch from N on that has key changes of m_pk
leaving TOAST values unchanged (their values may come from the target's row under the old
key, which the MERGE deletes) is merged into m_pk,
the process writes the batch id to DIR/killme and sleeps: the test kills it there, before
the checkpoint records the batch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

CATALOG = "pgdecode_disk"
CATALOG_CLASS = "pgdecode.testing.RowLevelCatalog"


def session(jar: str, tables: Path) -> Any:
    from support.spark_fixtures import spark_env

    spark_env()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("pgdecode-merge")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.jars", jar)
             .config(f"spark.sql.catalog.{CATALOG}", CATALOG_CLASS)
             .config(f"spark.sql.catalog.{CATALOG}.path", str(tables))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--jar", required=True)
    parser.add_argument("--endpos")
    parser.add_argument("--kill-from", type=int)
    parser.add_argument("--max-rows", type=int, default=7)
    args = parser.parse_args(argv)
    work = Path(args.work)

    from plugin_framework.spark import ForeachBatchStream, MergeIntoWriter

    fills = {"batch": False}

    def merged(table: str, batch_id: int) -> None:
        with open(work / "merged", "a") as f:
            f.write(f"{batch_id}\n")
        if args.kill_from is not None and batch_id >= args.kill_from and fills["batch"]:
            (work / "killme").write_text(str(batch_id))
            time.sleep(600)  # killed here: merged, not yet recorded in the checkpoint

    spark = session(args.jar, work / "tables")
    writer = MergeIntoWriter(f"{CATALOG}.mirror.{{table}}", str(work / "staging"),
                             tables=["public.m_pk"], on_table=merged, create="")

    def fn(df: Any, batch_id: int) -> None:
        fills["batch"] = df.filter("`table` = 'm_pk' AND op = 'UPDATE' AND before IS NOT NULL "
                                   "AND size(unchanged_toast) > 0").count() > 0
        writer(df, batch_id)

    ForeachBatchStream(spark, fn, dsn=args.dsn, slot=args.slot,
                       publications=["mirror_pub"], checkpoint=str(work / "checkpoint"),
                       max_rows=args.max_rows, endpos=args.endpos).run()
    (work / "done").touch()
    spark.stop()


if __name__ == "__main__":
    main()
