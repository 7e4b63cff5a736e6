"""A ForeachBatchStream that signals, and for some steps stops, at one step of the way of
prepared transactions into a finished batch, for test_spark_prepared_kill.py:

    PYTHONPATH=tests python tests/support/spark_prepared_runner.py --dsn ... --slot ... \\
        --work DIR --step STEP --gids g1,g2 [--endpos LSN] [--max-rows N]

STEP is where the test kills the process (with SIGKILL, from outside):

- ``prepared``: every gid's PREPARE received (the process goes on streaming);
- ``committed``: every gid's COMMIT PREPARED received, their rows in a batch not delivered
  yet (the process goes on streaming and acknowledging);
- ``in_fn``: fn has written a batch holding their rows, and not returned;
- ``fn_returned``: fn returned, the checkpoint does not record the batch finished yet;
- ``batch_committed``: the checkpoint records it finished, no acknowledgement sent since;
- ``acknowledged``: the batch finished (the process goes on acknowledging).

When it gets there it touches ``DIR/killme``; the steps that stop sleep there. fn writes each
batch's rows to ``DIR/out/batch-N.jsonl`` (written again whole when the batch is delivered
again: idempotent by batch id), and touches ``DIR/done`` when the stream ends at endpos.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

STEPS = ("prepared", "committed", "in_fn", "fn_returned", "batch_committed", "acknowledged")
STOPPING = ("in_fn", "fn_returned", "batch_committed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slot", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--step", choices=STEPS)
    parser.add_argument("--gids", default="")
    parser.add_argument("--endpos")
    parser.add_argument("--max-rows", type=int, default=1)
    args = parser.parse_args()

    from plugin_framework.spark import ForeachBatchStream
    from plugin_framework.spark.changes.rows import local_rows
    from plugin_framework.spark.foreachbatch.plugin import ForeachBatchPlugin
    from support.spark_fixtures import new_session

    work = Path(args.work)
    (work / "out").mkdir(exist_ok=True)
    gids = set(filter(None, args.gids.split(",")))
    step = args.step

    def reached(name: str) -> None:
        if name == step:
            (work / "killme").touch()
            if name in STOPPING:
                time.sleep(3600)

    class Stepping(ForeachBatchPlugin):
        """The spark emitter's plugin, telling where the gids' transactions are."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.prepared: set[str] = set()
            self.committed: set[str] = set()
            self.holding = False  # the batch being delivered holds rows of the gids

        def prepare(self, ctx: Any, txn: Any, prepare_lsn: Any) -> None:
            super().prepare(ctx, txn, prepare_lsn)
            self._seen(self.prepared, txn.gid, "prepared")

        def commit_prepared(self, ctx: Any, txn: Any, commit_lsn: Any) -> None:
            super().commit_prepared(ctx, txn, commit_lsn)
            self._seen(self.committed, txn.gid, "committed")

        def _seen(self, seen: set[str], gid: str, name: str) -> None:
            if gid in gids and gid not in seen:
                seen.add(gid)
                if seen == gids:
                    reached(name)

        def _finished(self, br: Any, ack: Any) -> None:
            if self.holding:
                reached("fn_returned")
            super()._finished(br, ack)
            if self.holding:
                self.holding = False
                reached("batch_committed")
                reached("acknowledged")

    def fn(df: Any, batch_id: int) -> None:
        rows = local_rows(df).to_pylist()
        with open(work / "out" / f"batch-{batch_id}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({"batch": batch_id, "commit_lsn": r["commit_lsn"],
                                    "seq": r["seq"], "op": r["op"], "gid": r["gid"],
                                    "id": int(dict(r["after"])["id"])}) + "\n")
        if any(r["gid"] in gids for r in rows):
            plugin.holding = True
            reached("in_fn")

    spark = new_session("pgdecode-prepared")
    stream = ForeachBatchStream(spark, fn, dsn=args.dsn, slot=args.slot, publications=["p"],
                                checkpoint=str(work / "checkpoint"), max_rows=args.max_rows,
                                max_delay=3600, status_interval=0.1, endpos=args.endpos)
    plugin = Stepping(fn, spark=spark, checkpoint=str(work / "checkpoint"),
                      max_rows=args.max_rows, max_delay=3600)
    stream.plugin = plugin
    stream.run()
    (work / "done").touch()
    spark.stop()


if __name__ == "__main__":
    main()
