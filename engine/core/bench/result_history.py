"""Result history: every bench, with the machine it ran on, in one SQLite file.

Plain Python. The default file is ``$DDPTUI_RESULTS_DB``, else ``results.sqlite3`` in the user's
data directory (``$DDPTUI_DATA_DIR``, else ``$XDG_DATA_HOME/ddptui``, else
``~/.local/share/ddptui``); ``ddptui results`` shows which, and ``--db`` picks another.

The schema version lives in ``PRAGMA user_version`` and the file is marked as ddptui's with
``PRAGMA application_id``. A database from a newer ddptui, or a file that is not a ddptui results
database, is refused with one sentence (``HistoryError``) before anything is written: it is never
migrated down, overwritten or truncated.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.bench.speedup_table import SpeedupTable, TableError
from engine.core.common import strict_json
from engine.core.host.machine_info import MachineInfo
from engine.core.runs.summary import RunSummary

HISTORY_SCHEMA_VERSION = 1
APPLICATION_ID = 0x64647475  # "ddtu"
DB_FILENAME = "results.sqlite3"

_SCHEMA = """
CREATE TABLE benches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    title TEXT NOT NULL,
    command TEXT NOT NULL,
    machine_json TEXT NOT NULL,
    table_json TEXT NOT NULL
);
CREATE TABLE bench_runs (
    bench_id INTEGER NOT NULL REFERENCES benches(id) ON DELETE CASCADE,
    row_label TEXT NOT NULL,
    repeat INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    summary_json TEXT NOT NULL
);
CREATE INDEX bench_runs_by_bench ON bench_runs(bench_id);
"""


class HistoryError(RuntimeError):
    """The results database cannot be used; the message is one sentence naming the file."""


def default_data_dir() -> Path:
    env = os.environ.get("DDPTUI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "ddptui"


def default_db_path() -> Path:
    env = os.environ.get("DDPTUI_RESULTS_DB")
    if env:
        return Path(env).expanduser()
    return default_data_dir() / DB_FILENAME


@dataclass(frozen=True)
class RecordedRun:
    """One run behind a bench row (a row run K times has K of these)."""

    row_label: str
    repeat: int  # 1-based
    run_dir: str
    summary: RunSummary


@dataclass(frozen=True)
class BenchListing:
    """One line of ``ddptui results``."""

    id: int
    created: float
    title: str
    host: str
    gpus: str
    rows: int
    completed_rows: int


@dataclass(frozen=True)
class BenchRecord:
    id: int
    created: float
    title: str
    command: str
    machine: MachineInfo
    table: SpeedupTable
    runs: tuple[RecordedRun, ...] = ()

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))


class ResultHistory:
    """An open results database. Use as a context manager, or call ``close``.

    ``ResultHistory(path)`` creates the file (and its directory) when missing, unless ``create`` is
    false (readers: a missing file is then a HistoryError), and refuses a newer or foreign database
    without touching it.
    """

    def __init__(self, path: Path | None = None, *, create: bool = True) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self._db = self._open(create)

    def _open(self, create: bool) -> sqlite3.Connection:
        path = self.path
        if path.exists() and not path.is_file():
            raise HistoryError(f"{path}: the results database path is not a file")
        if not path.exists() and not create:
            raise HistoryError(
                f"{path}: no results database here yet; `ddptui bench` makes it (or pass --db)"
            )
        if path.exists():
            # Opened read-write but never created: a missing file here would be a race, not ours.
            uri = f"file:{path.resolve()}?mode=rw"
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise HistoryError(
                    f"{path.parent}: cannot create the results directory ({err.strerror})"
                ) from None
            uri = f"file:{path.resolve()}?mode=rwc"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=10.0)
        except sqlite3.Error as err:
            raise HistoryError(f"{path}: cannot open the results database ({err})") from None
        try:
            self._check_or_create(db)
        except BaseException:
            db.close()
            raise
        db.execute("PRAGMA foreign_keys = ON")
        return db

    def _check_or_create(self, db: sqlite3.Connection) -> None:
        path = self.path
        try:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            app_id = int(db.execute("PRAGMA application_id").fetchone()[0])
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        except sqlite3.DatabaseError as err:
            raise HistoryError(
                f"{path}: not a ddptui results database ({err}); it was left as it is, so pass "
                "--db with another file"
            ) from None
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            raise HistoryError(
                f"{path}: this SQLite file is not a ddptui results database; it was left as it "
                "is, so pass --db with another file"
            )
        if version > HISTORY_SCHEMA_VERSION:
            raise HistoryError(
                f"{path}: the results database was written by a newer ddptui (schema {version}, "
                f"this one knows {HISTORY_SCHEMA_VERSION}); it was left untouched, so upgrade "
                "ddptui or pass --db with another file"
            )
        if version == 0 and not tables:
            with db:
                db.executescript(
                    "BEGIN;"
                    + _SCHEMA
                    + f"PRAGMA application_id = {APPLICATION_ID};"
                    + f"PRAGMA user_version = {HISTORY_SCHEMA_VERSION};"
                    + "COMMIT;"
                )

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ResultHistory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing ---------------------------------------------------------------------------------

    def record(
        self,
        *,
        title: str,
        command: str,
        machine: MachineInfo,
        table: SpeedupTable,
        runs: Sequence[RecordedRun] = (),
        created: float | None = None,
    ) -> int:
        """Store one bench; returns its id."""
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO benches (created, title, command, machine_json, table_json) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    created if created is not None else time.time(),
                    title,
                    command,
                    strict_json.dumps(machine.to_json()),
                    strict_json.dumps(table.to_json()),
                ),
            )
            bench_id = cursor.lastrowid
            assert bench_id is not None
            self._db.executemany(
                "INSERT INTO bench_runs (bench_id, row_label, repeat, run_id, run_dir, "
                "summary_json) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    (
                        bench_id,
                        run.row_label,
                        run.repeat,
                        run.summary.run_id,
                        run.run_dir,
                        strict_json.dumps(run.summary.to_json()),
                    )
                    for run in runs
                ],
            )
        return int(bench_id)

    # ---- reading ---------------------------------------------------------------------------------

    def list(self) -> list[BenchListing]:
        """Every bench, newest first."""
        listings = []
        for bench_id, created, title, machine_json, table_json in self._db.execute(
            "SELECT id, created, title, machine_json, table_json FROM benches ORDER BY id DESC"
        ):
            machine = _machine(machine_json)
            rows = _json(table_json).get("rows", [])
            listings.append(
                BenchListing(
                    id=int(bench_id),
                    created=float(created),
                    title=str(title),
                    host=machine.host,
                    gpus=machine.gpu_summary,
                    rows=len(rows),
                    completed_rows=sum(1 for r in rows if r.get("status") == "ok"),
                )
            )
        return listings

    def get(self, bench_id: int) -> BenchRecord:
        found = self._db.execute(
            "SELECT id, created, title, command, machine_json, table_json FROM benches "
            "WHERE id = ?",
            (bench_id,),
        ).fetchone()
        if found is None:
            known = [str(r[0]) for r in self._db.execute("SELECT id FROM benches ORDER BY id")]
            which = f"ids {known[0]} to {known[-1]}" if known else "no benches yet"
            raise HistoryError(f"{self.path}: no bench with id {bench_id} ({which})")
        _, created, title, command, machine_json, table_json = found
        try:
            table = SpeedupTable.from_json(_json(table_json))
        except TableError as err:
            raise HistoryError(f"{self.path}: bench {bench_id}: {err}") from None
        runs = tuple(
            RecordedRun(
                row_label=str(label),
                repeat=int(repeat),
                run_dir=str(run_dir),
                summary=RunSummary.from_json(_json(summary_json)),
            )
            for label, repeat, run_dir, summary_json in self._db.execute(
                "SELECT row_label, repeat, run_dir, summary_json FROM bench_runs "
                "WHERE bench_id = ? ORDER BY rowid",
                (bench_id,),
            )
        )
        return BenchRecord(
            id=int(bench_id),
            created=float(created),
            title=str(title),
            command=str(command),
            machine=_machine(machine_json),
            table=table,
            runs=runs,
        )


def _json(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _machine(text: str) -> MachineInfo:
    return MachineInfo.from_json(_json(text))
