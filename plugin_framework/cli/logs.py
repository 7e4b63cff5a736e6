"""Logging of the command line: text or JSON lines (--log-format) on stderr."""

from __future__ import annotations

import argparse
import json
import logging
import sys


class JsonLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname.lower(),
                 "logger": record.name, "message": record.getMessage()}
        for key in EXTRA_FIELDS:  # logged with extra={key: ...}
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


# What a log record may carry besides its message, as a JSON log line's fields: a snapshot's
# progress (sources.session.SnapshotProgress.fields)
EXTRA_FIELDS = ("snapshot",)


def setup_logging(args: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("pgdecode: %(levelname)s: %(message)s"))
    root = logging.getLogger("pgdecode")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if getattr(args, "verbose", False) else logging.INFO)
    root.propagate = False
