"""A run directory: everything one job run writes, so that it can be inspected, reported
on and resumed.

    RUN/
      job.toml            copy of the job file as submitted
      config.json         the resolved, validated configuration
      env.json            Python, platform and package versions
      events.jsonl        one JSON event a line (start, point done, failure, end, ...)
      .lock               pid of the process running the job (absent when not running)
      results/            sweep: one JSON file per finished (point, fold) task
      results.parquet     sweep: every finished task, rewritten atomically after each
      metrics.json        evaluation per split (and the sweep's choice)
      model/              the fitted model as npz + JSON (bigrate.load_model)

Every file is written through a temporary file renamed into place; ``events.jsonl`` is
appended a line at a time with fsync, and a torn last line is skipped when read.

The library's sweeps (:class:`bigrate.NPSearchCV`) and the job runner both keep their
results here; :class:`MemoryStore` is the same interface without a directory, for a
sweep that need not survive its process.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import socket
import sys
from pathlib import Path

from bigrate.files import atomic_write_text, jsonable, pid_alive


class RunLockedError(RuntimeError):
    """Another live process is running this run directory."""


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in (
        "bigrate",
        "numpy",
        "scipy",
        "scikit-learn",
        "pyarrow",
        "numba",
        "dask",
        "distributed",
        "ray",
        "matplotlib",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


class RunDir:
    """Create (:meth:`create`) or reopen (:meth:`open`) a run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._locked = False
        self._results = None  # the task records, kept while locked

    # -- creation ---------------------------------------------------------------
    @classmethod
    def create(
        cls, parent: str | os.PathLike, name: str, job_file: str | None, config: dict
    ) -> RunDir:
        """A new, unique run directory ``parent/name-YYYYmmdd-HHMMSS[-N]``, locked."""
        parent = Path(parent)
        parent.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        for k in range(1000):
            path = parent / (f"{name}-{stamp}" + (f"-{k}" if k else ""))
            try:
                path.mkdir()  # atomic: two runs never get the same directory
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover
            raise RuntimeError(f"could not create a run directory under {parent}")
        return cls._fill(path, job_file, config)

    @classmethod
    def create_at(
        cls, path: str | os.PathLike, job_file: str | None, config: dict
    ) -> RunDir:
        """A new run directory at exactly ``path`` (which must not exist), locked."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()  # FileExistsError if it does
        return cls._fill(path, job_file, config)

    @classmethod
    def _fill(cls, path: Path, job_file: str | None, config: dict) -> RunDir:
        run = cls(path)
        run.lock()
        if job_file:
            shutil.copyfile(job_file, path / ".job.toml.tmp")
            os.replace(path / ".job.toml.tmp", path / "job.toml")
        run.write_json("config.json", config)
        run.write_json("env.json", versions())
        (path / "results").mkdir()
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> RunDir:
        run = cls(path)
        if not (run.path / "config.json").is_file():
            raise FileNotFoundError(
                f"{run.path}: not a bigrate run directory (no config.json)"
            )
        return run

    # -- lock ---------------------------------------------------------------------
    def lock(self) -> None:
        """Take the run's lock file, or raise RunLockedError if a live process has it."""
        lock = self.path / ".lock"
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": _now(),
            "argv": sys.argv,
        }
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    other = json.loads(lock.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    other = {}
                pid = int(other.get("pid", -1))
                if (
                    other.get("host") == socket.gethostname()
                    and pid > 0
                    and not pid_alive(pid)
                ):
                    self.event("stale_lock_removed", pid=pid)
                    lock.unlink(missing_ok=True)
                    continue
                raise RunLockedError(
                    f"{self.path}: the run is in use by pid {pid} on {other.get('host')} "
                    f"since {other.get('since')} ({' '.join(other.get('argv', []))}); two "
                    "runs never share a run directory: wait for it, or stop it first"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self._locked = True
            return
        raise RunLockedError(
            f"{self.path}: could not take the lock"
        )  # pragma: no cover

    def unlock(self) -> None:
        if self._locked:
            (self.path / ".lock").unlink(missing_ok=True)
            self._locked = False
            self._results = None

    def locked_by(self) -> dict | None:
        lock = self.path / ".lock"
        if not lock.exists():
            return None
        try:
            info = json.loads(lock.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return None
        if info.get("host") == socket.gethostname() and not pid_alive(
            int(info.get("pid", -1))
        ):
            return None
        return info

    # -- files ------------------------------------------------------------------
    def write_json(self, name: str, obj) -> str:
        """Write ``obj`` as ``name`` (atomically); returns the text written."""
        text = json.dumps(jsonable(obj), indent=2) + "\n"
        atomic_write_text(self.path / name, text)
        return text

    def read_json(self, name: str):
        return json.loads((self.path / name).read_text())

    def event(self, event_name: str, **fields) -> None:
        line = json.dumps(jsonable({"time": _now(), "event": event_name, **fields}))
        with open(self.path / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def events(self) -> list[dict]:
        p = self.path / "events.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a crash
        return out

    # -- sweep results --------------------------------------------------------------
    @staticmethod
    def task_key(point: int, fold: int) -> str:
        return f"point-{point:05d}-fold-{fold:03d}"

    def save_result(self, point: int, fold: int, record: dict) -> None:
        text = self.write_json(f"results/{self.task_key(point, fold)}.json", record)
        if self._results is not None:  # as it reads back from the file
            self._results[(int(point), int(fold))] = json.loads(text)

    def results(self) -> dict[tuple[int, int], dict]:
        """Every task record in results/. While this process holds the run's lock (no
        other process writes there), the records are read once and then kept up to date
        by :meth:`save_result`, so a long sweep does not re-read all of them each time."""
        if self._results is not None and self._locked:
            return dict(self._results)
        out = {}
        for p in sorted((self.path / "results").glob("point-*-fold-*.json")):
            try:
                rec = json.loads(p.read_text())
            except json.JSONDecodeError:  # pragma: no cover - writes are atomic
                continue
            out[(int(rec["point"]), int(rec["fold"]))] = rec
        self._results = out if self._locked else None
        return dict(out)

    def write_results_table(self) -> None:
        """Rewrite results.parquet from the per-task files (atomically)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        recs = list(self.results().values())
        if not recs:
            return
        rows = []
        for r in recs:
            row = {
                "point": r["point"],
                "fold": r["fold"],
                "status": r["status"],
                "params": json.dumps(r.get("params", {}), sort_keys=True),
                "seconds": r.get("seconds"),
                "error": r.get("error"),
            }
            for k, v in (r.get("metrics") or {}).items():
                row[k] = v
            rows.append(row)
        keys = sorted({k for row in rows for k in row})
        table = pa.table({k: [row.get(k) for row in rows] for k in keys})
        tmp = self.path / ".results.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, self.path / "results.parquet")


class MemoryStore:
    """The results interface of :class:`RunDir` (``results``, ``save_result``,
    ``event``, ``write_results_table``) kept in memory: a sweep without a run
    directory leaves nothing on disk."""

    path = None

    def __init__(self):
        self._results: dict[tuple[int, int], dict] = {}
        self.log: list[dict] = []

    def results(self) -> dict[tuple[int, int], dict]:
        return dict(self._results)

    def save_result(self, point: int, fold: int, record: dict) -> None:
        self._results[(int(point), int(fold))] = record

    def event(self, event_name: str, **fields) -> None:
        self.log.append({"time": _now(), "event": event_name, **fields})

    def events(self) -> list[dict]:
        return list(self.log)

    def write_results_table(self) -> None:
        pass

    def unlock(self) -> None:
        pass


def run_state(run: RunDir) -> tuple[str, str]:
    """(state, detail) of a run directory from its lock and events: "running",
    "complete", "interrupted" (resume continues), "failed" (with whether resume can
    help) or "not started"."""
    events = run.events()
    kinds = [e["event"] for e in events]
    lock = run.locked_by()
    if lock:
        return "running", f"pid {lock.get('pid')} on {lock.get('host')}"
    if "run_finished" in kinds and (run.path / "metrics.json").exists():
        return "complete", ""
    last = next(
        (e for e in reversed(events) if e["event"] in ("run_failed", "interrupted")),
        None,
    )
    if last is not None and last["event"] == "run_failed":
        if last.get("cluster_lost"):  # the message holds the resume command
            return "interrupted", last.get("error", "")
        if last.get("resumable", True):
            return "failed", (
                f"{last.get('error')}; resume may help if the cause was passing "
                f"(a lost cluster): bigrate resume {run.path}"
            )
        return "failed", (
            f"{last.get('error')}; resuming cannot help: fix the cause and run the job "
            "again"
        )
    if events:
        ck = next(
            (e.get("round") for e in reversed(events) if e["event"] == "checkpoint"),
            None,
        )
        where = f" (checkpoint after round {ck})" if ck is not None else ""
        return "interrupted", f"continue with `bigrate resume {run.path}`{where}"
    return "not started", ""


_STAMP = re.compile(r"-(\d{8}-\d{6})(?:-(\d+))?$")


def find_runs(parent: str | os.PathLike, name: str | None = None) -> list[RunDir]:
    """The run directories under ``parent`` (those of job ``name`` only, if given),
    oldest first by the time stamp in their names."""
    parent = Path(parent)
    out = []
    if not parent.is_dir():
        return out
    for p in parent.iterdir():
        m = _STAMP.search(p.name)
        if not m or not (p / "config.json").is_file():
            continue
        if name is not None and p.name[: m.start()] != name:
            continue
        out.append((m.group(1), int(m.group(2) or 0), p))
    return [RunDir(p) for _, _, p in sorted(out)]


def resolve_latest(path: str | os.PathLike) -> Path:
    """``path`` with a component ``NAME-LATEST`` replaced by the newest complete run of
    job NAME in that folder (``runs/a9a-np-LATEST/model``); other paths as they are."""
    path = Path(path)
    parts = path.parts
    for i, part in enumerate(parts):
        if part.endswith("-LATEST"):
            parent = Path(*parts[:i]) if i else Path(".")
            name = part[: -len("-LATEST")]
            done = [r for r in find_runs(parent, name) if run_state(r)[0] == "complete"]
            if not done:
                raise FileNotFoundError(
                    f"{path}: no complete run of job {name!r} in {parent} (run the "
                    "job first; `bigrate runs` lists them)"
                )
            return done[-1].path.joinpath(*parts[i + 1 :])
    return path
