"""The options of the ``pgoutput`` data source (reader.py's docstring lists them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class SourceOptionError(ValueError):
    pass


def _bool(text: str | None, default: bool) -> bool:
    if text is None:
        return default
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise SourceOptionError(f"expected true or false, not {text!r}")


def _port(text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise SourceOptionError(f"metricsPort must be between 1 and 65535, not {port}")
    return port


@dataclass(frozen=True)
class SourceOptions:
    dsn: str
    slot: str
    publications: tuple[str, ...]
    create_slot: bool = False
    max_changes: int | None = 100_000
    rows_per_partition: int = 50_000
    idle_advance_bytes: int = 16 * 1024 * 1024
    proto_version: int | None = None
    streaming: str = "on"
    snapshot: str = "never"
    snapshot_tables: tuple[str, ...] = ()
    snapshot_chunk_rows: int = 10_000
    metrics_port: int | None = None  # serve Prometheus metrics (metrics.py)
    metrics_address: str = ""

    @classmethod
    def parse(cls, options: Any) -> SourceOptions:
        def get(name: str) -> str | None:
            value = options.get(name)
            return None if value is None else str(value)

        dsn, slot, pubs = get("dsn"), get("slot"), get("publication")
        if not slot:
            raise SourceOptionError('the pgoutput source needs .option("slot", ...)')
        if not pubs:
            raise SourceOptionError('the pgoutput source needs .option("publication", ...)')
        max_changes = get("maxChangesPerBatch")
        proto = get("protoVersion")
        port = get("metricsPort")
        snapshot = (get("snapshot") or "never").strip().lower()
        if snapshot not in ("never", "initial"):
            raise SourceOptionError(
                f'.option("snapshot", ...) takes never or initial, not {snapshot!r}')
        try:
            return cls(
                dsn=dsn or "", slot=slot,
                publications=tuple(p.strip() for p in pubs.split(",") if p.strip()),
                create_slot=_bool(get("createSlot"), False),
                max_changes=(100_000 if max_changes is None
                             else int(max_changes) if int(max_changes) > 0 else None),
                rows_per_partition=int(get("rowsPerPartition") or 50_000),
                idle_advance_bytes=int(get("idleAdvanceBytes") or 16 * 1024 * 1024),
                proto_version=int(proto) if proto else None,
                streaming=(get("streaming") or "on").lower(),
                snapshot=snapshot,
                snapshot_tables=tuple(t.strip() for t in (get("snapshotTables") or "").split(",")
                                      if t.strip()),
                snapshot_chunk_rows=max(1, int(get("snapshotChunkRows") or 10_000)),
                metrics_port=_port(port) if port else None,
                metrics_address=get("metricsAddress") or "",
            )
        except ValueError as exc:
            raise SourceOptionError(f"bad pgoutput source option: {exc}") from None
