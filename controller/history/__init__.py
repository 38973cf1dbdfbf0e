"""Run history: SQLite on the controller, with column files of ended runs' rows beside it (the only package of the
controller that touches the database).

Parts: :mod:`~controller.history.schema` (tables, migrations, a row's columns),
:mod:`~controller.history.records` (what callers get back, the history's error),
:mod:`~controller.history.store` (:class:`History`: runs, progress, events, rows, baselines,
telemetry), :mod:`~controller.history.outbox` (webhook outbox),
:mod:`~controller.history.queries` (the aggregate reads of the fleet, the metrics and the reports),
:mod:`~controller.history.frames` (a run's rows read column-wise into the report's frame, from the run's column
file when it is current, else from SQLite; ``fleetctl history migrate``) and :mod:`~controller.history.columns`
(the column files' format, atomic write and checked read, no SQL).
``tests/unit/test_sql_boundary.py`` fails when SQL runs anywhere else in ``controller/``.
"""

from controller.history.copy import CopyDone, copy_history
from controller.history.frames import FrameCache
from controller.history.queries import DatabaseError
from controller.history.records import (
    CHANGE_CHECK_EVENT,
    CHANGE_POINT_EVENT,
    GOLDEN_DRIFT_EVENT,
    GOLDEN_NOTE,
    RESET_EVENT,
    VERDICT_EVENT,
    HistoryError,
    HistoryFull,
    HistoryStopped,
    HistoryUnavailable,
    OutboxEvent,
    RunInfo,
    UnsentRequest,
    url_digest,
)
from controller.history.schema import ROW_FIELDS, row_from_db, row_to_db
from controller.history.store import History

__all__ = [
    "CopyDone", "DatabaseError", "FrameCache", "History", "HistoryError", "HistoryFull", "HistoryStopped",
    "HistoryUnavailable", "OutboxEvent", "RESET_EVENT", "ROW_FIELDS", "RunInfo", "UnsentRequest",
    "CHANGE_CHECK_EVENT", "CHANGE_POINT_EVENT", "GOLDEN_DRIFT_EVENT", "GOLDEN_NOTE", "VERDICT_EVENT", "copy_history",
    "row_from_db", "row_to_db", "url_digest",
]
