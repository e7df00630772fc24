"""MetaSchedule's database in Fleet's store: its workloads and tuning records, with provenance.

Rows keep MetaSchedule's own JSON text: a workload line (``[structural hash, base64 IRModule]``) as TVM wrote it,
since it depends on the TVM version that serialized it, and a record's ``[trace, run_secs, target, args_info]``
as MetaSchedule's JSON database writes it, so that its files go in and come out line for line. The access
functions are :mod:`fleet.tvm.msdb`'s; the store only holds the tables.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Float, ForeignKey, Index, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from fleet.store._models import Base, utcnow


class MsWorkload(Base):
    """A MetaSchedule workload: one IRModule, as the line of ``database_workload.json`` that holds it."""

    __tablename__ = "ms_workloads"
    __table_args__ = (UniqueConstraint("line_key", name="uq_ms_workload_line"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    shash: Mapped[str] = mapped_column(String(32), index=True)  # MetaSchedule's structural hash, as text
    line: Mapped[str] = mapped_column(Text)
    line_key: Mapped[str] = mapped_column(String(64))  # sha256 of the line
    tvm: Mapped[str] = mapped_column(String(64), default="")  # the TVM version that wrote it, where known
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class MsRecord(Base):
    """A MetaSchedule tuning record of a workload, with where it was measured."""

    __tablename__ = "ms_records"
    __table_args__ = (
        UniqueConstraint("workload_id", "record_key", "team", name="uq_ms_record"),
        Index("ix_ms_records_workload_seconds", "workload_id", "mean_seconds"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("ms_workloads.id", ondelete="CASCADE"))
    record: Mapped[str] = mapped_column(Text)  # [trace, run_secs, target, args_info], MetaSchedule's text
    record_key: Mapped[str] = mapped_column(String(64))  # sha256 of the record text
    mean_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: a failed candidate
    target: Mapped[str] = mapped_column(String(64), default="")  # the TVM target's kind (llvm, cuda, ...)
    provenance: Mapped[dict[str, Any]]
    # The team whose tune-ms or import-ms made it (a PostgreSQL role, migration 0015); '' for an operator's, which
    # only operators and the service see.
    team: Mapped[str] = mapped_column(String(63), default="", server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
