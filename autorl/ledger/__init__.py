"""ledger.sqlite: the one record of every study, trial, metric and event.

All SQL lives in this package. Tables are prefixed ``autorl_`` so Optuna's own tables (its RDB storage lives in
the same file, so ``optuna-dashboard sqlite:///ledger.sqlite`` opens the study) never collide. WAL mode, and one
transaction per state change: a kill at any instant leaves a ledger that opens, passes ``PRAGMA integrity_check``
and resumes.

- ``rows``: each table's columns, their types and meanings (docs/ledger.md is generated from them), the check
  every write passes;
- ``migrations``: the schema, one frozen step at a time (recorded in ``autorl_migrations``);
- ``files``: the file a ledger opened: its identity (a ledger removed or replaced while a study runs stops the
  study before anything more is written), its lock, its whole-file check, read-only opening;
- ``store``: ``Ledger`` (every statement) and ``StudyRecords`` (one study's face and the queries a running study
  asks), ``open_read`` and ``ledger_guard``;
- ``views``: a study's rows kept current in memory, each query a view a changed row is put into once;
- ``errors``: any SQLite failure as one ``LedgerError`` line (``DiskFullError`` for a full disk).
"""

from autorl.ledger.errors import disk_full, free_bytes, ledger_error
from autorl.ledger.rows import TRIAL_COLUMNS, Event, Study, Trial
from autorl.ledger.store import Ledger, StudyRecords, ledger_guard, open_read

__all__ = [
    "TRIAL_COLUMNS",
    "Ledger",
    "StudyRecords",
    "Event",
    "Study",
    "Trial",
    "disk_full",
    "free_bytes",
    "ledger_error",
    "ledger_guard",
    "open_read",
]
