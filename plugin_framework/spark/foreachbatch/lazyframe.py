"""A batch's DataFrame that is made in the JVM only when something reads it.

``spark.createDataFrame(table)`` writes the whole Arrow table to a temporary file that the
JVM then reads: on batches of TOAST-heavy rows, more time than decoding them. The sinks
never need it (they read the driver's Arrow table, ``changes.rows.local_rows``), and a
``foreachBatch`` function may not either. So the emitter hands over a ``LazyFrame``: a
real classic DataFrame (``isinstance`` holds, every method works) whose JVM side,
``_jdf``, every pyspark method reaches it through, is made from the table the first time
one asks for it, once, whichever thread asks. Its ``schema`` is known without the JVM.

Under Spark Connect a DataFrame has no JVM side and is lazy already: ``frame`` makes a
plain one there.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import Any, Final

from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

from plugin_framework.spark.settings import session_setting

log = logging.getLogger("pgdecode.spark")


class LazyFrame(ClassicFrame):
    """A DataFrame whose JVM side is ``make()._jdf``, made at the first use."""

    def __init__(self, make: Callable[[], Any], session: Any, schema: Any) -> None:
        self._make = make
        self._making = threading.Lock()
        super().__init__(None, session)  # sets _jdf to None: not made yet
        # DataFrame.schema is a cached_property, which a caller may change in place
        # (StructType.add): each frame has its own, as a made one's is parsed from the JVM
        self.__dict__["schema"] = copy.deepcopy(schema)

    @property
    def _jdf(self) -> Any:
        made = self.__dict__.get("_made")
        if made is None:
            with self._making:
                made = self.__dict__.get("_made")
                if made is None:
                    try:
                        made = self.__dict__["_made"] = self._make()._jdf
                    except AttributeError as e:
                        # which Python would take for "no attribute _jdf" and hand to
                        # DataFrame.__getattr__, hiding the cause
                        raise RuntimeError(f"the batch's DataFrame was not made: {e}") from e
        return made

    @_jdf.setter
    def _jdf(self, value: Any) -> None:
        self.__dict__["_made"] = value

    @property
    def made(self) -> bool:
        """Whether the JVM side exists (a job or a method has needed it)."""
        return self.__dict__.get("_made") is not None


_LOCAL_RELATION: Final = "spark.sql.execution.arrow.localRelationThreshold"
_SETTING = threading.Lock()  # held while a batch's frame is made with that setting at 0


def batch_frame(spark: Any, table: Any, schema: Any) -> Any:
    """Arrow table ``table``'s DataFrame (of ``schema``), made in the JVM only when
    something reads it (``frame``).

    Spark keeps a DataFrame made from Arrow data under the session's
    localRelationThreshold (48 MB) as a LocalRelation: every row converted in the driver,
    at once, whether ``fn`` reads them or not, which took most of a no-op batch's time.
    With the threshold at 0 for this call, the batch stays Arrow until a job reads it
    (the same rows: only when they are converted differs). The session's own setting is
    back after the call."""
    def make() -> Any:
        # fn's threads may make two batches' frames at once: one setting at a time
        with _SETTING, session_setting(spark, _LOCAL_RELATION, "0"):
            return spark.createDataFrame(table, schema)

    return frame(spark, make, schema)


def frame(spark: Any, make: Callable[[], Any], schema: Any) -> Any:
    """``make()``'s DataFrame, made when first used where the session has a JVM
    (classic); made now under Spark Connect."""
    if getattr(spark, "_jsparkSession", None) is None:
        return make()
    return LazyFrame(make, spark, schema)


_TASKS_LOGGER = "org.apache.spark.scheduler.TaskSetManager"
_LARGE_TASK = ".*contains a task of very large size.*"


def quiet_large_tasks(spark: Any) -> None:
    """Drop Spark's warning "Stage N contains a task of very large size" (over 1 MB), and
    only that message of its logger: a batch's rows travel to the executors in the tasks
    of the jobs that read it (``createDataFrame``'s design), so each such job would print
    it, batch after batch, at the default log level. Done once per JVM; nothing where the
    session has no JVM (Spark Connect) or its logging is not log4j 2."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return
    try:
        core = jvm.org.apache.logging.log4j.core
        context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
        config = context.getConfiguration()
        # A filter of the whole configuration: a logger config of TaskSetManager's own would
        # take it out of Spark's shell-level filter, and its INFO lines would show
        if _LARGE_TASK in str(config.getFilter()):
            return
        result = getattr(core, "Filter$Result")
        config.addFilter(core.filter.RegexFilter.createFilter(
            _LARGE_TASK, None, True, result.DENY, result.NEUTRAL))
        context.updateLoggers()
    except Exception as e:  # (a log4j 1 or custom logging setup): the warnings stay
        log.debug("Spark's large-task warnings stay: %s", e)
