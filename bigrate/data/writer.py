"""Atomic writer of a sharded dataset.

Everything is written into a hidden temporary directory beside the target
(``.<name>.tmp-<pid>-<random>``) and renamed into place only once the manifest is
complete, so a failed or interrupted prep never leaves a partial dataset at the target. A
temporary directory left by a process that was killed outright (SIGKILL) is removed by
the next writer of the same target once its process is gone.

A target on object storage (``s3://bucket/prefix`` or any fsspec URL that is not local)
has no rename: every part file is uploaded as soon as it is closed (a local copy lives
only until then) and the manifest is uploaded last, which is the commit. A prep that
dies midway leaves part files without a manifest, which no reader opens; overwriting a
dataset first deletes its manifest, so at no moment is an old manifest paired with new
files.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import posixpath
import re
import secrets
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from bigrate._version import __version__
from bigrate.data.format import (
    CLASSES,
    DEFAULT_ROW_GROUP_SIZE,
    DEFAULT_ROWS_PER_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    RowBlock,
    ShardFile,
    block_to_table,
    schema,
    table_to_block,
)
from bigrate.data.standardize import RunningMoments
from bigrate.errors import DataError, DatasetExistsError
from bigrate.files import atomic_write_text, pid_alive, replace_dir, sha256_file


class _PartWriter:
    """One Parquet file, written in row groups of exactly ``row_group_size`` rows."""

    def __init__(
        self, root: Path, rel: str, split: str, cls: str, owner: DatasetWriter
    ):
        self.root, self.rel, self.split, self.cls = root, rel, split, cls
        self.owner = owner
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(
            str(root / rel),
            schema(owner.has_group),
            compression=owner.compression,
            data_page_size=1 << 20,
            use_dictionary=["group"] if owner.has_group else False,
            write_statistics=["row_id", "label"],
        )
        self.pending: list[RowBlock] = []
        self.pending_rows = 0
        self.rows = 0
        self.nnz = 0
        self.row_groups = 0

    def append(self, block: RowBlock) -> None:
        if len(block) == 0:
            return
        self.pending.append(block)
        self.pending_rows += len(block)
        rgs = self.owner.row_group_size
        if self.pending_rows >= rgs:
            merged = RowBlock.concat(self.pending)
            full = (len(merged) // rgs) * rgs
            self._write(merged.take(np.arange(full)) if full < len(merged) else merged)
            rest = merged.take(np.arange(full, len(merged)))
            self.pending = [rest] if len(rest) else []
            self.pending_rows = len(rest)

    def _write(self, block: RowBlock) -> None:
        table = block_to_table(block, self.owner.has_group)
        rgs = self.owner.row_group_size
        self.writer.write_table(table, row_group_size=rgs)
        self.rows += len(block)
        self.nnz += int(block.X.nnz)
        self.row_groups += -(-len(block) // rgs)

    def close(self) -> ShardFile:
        if self.pending:
            self._write(RowBlock.concat(self.pending))
            self.pending = []
        self.writer.close()
        full = self.root / self.rel
        return ShardFile(
            path=self.rel,
            split=self.split,
            cls=self.cls,
            rows=self.rows,
            nnz=self.nnz,
            row_groups=self.row_groups,
            bytes=full.stat().st_size,
            sha256=sha256_file(full),
        )

    def abort(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - best effort while failing anyway
            pass


class ClassStream:
    """Appends rows of one (split, class) to numbered part files, rotating them at
    ``rows_per_file`` rows so that engines can spread a class over several workers."""

    def __init__(self, owner: DatasetWriter, split: str, cls: str):
        self.owner, self.split, self.cls = owner, split, cls
        self.part: _PartWriter | None = None
        self.next_index = 0

    def append(self, block: RowBlock) -> None:
        start = 0
        n = len(block)
        limit = self.owner.rows_per_file
        while start < n:
            if self.part is None:
                self.part = self.owner._open_part(self.split, self.cls, self.next_index)
                self.next_index += 1
            room = limit - (self.part.rows + self.part.pending_rows)
            stop = min(n, start + room)
            piece = (
                block
                if (start == 0 and stop == n)
                else block.take(np.arange(start, stop))
            )
            self.part.append(piece)
            start = stop
            if self.part.rows + self.part.pending_rows >= limit:
                self.owner._close_part(self.part)
                self.part = None

    def close(self) -> None:
        if self.part is not None:
            self.owner._close_part(self.part)
            self.part = None


def _remove_stale_temporaries(parent: Path, prefix: str) -> None:
    """Remove ``parent/<prefix><pid>-*`` left by writers whose process is gone (a
    SIGKILLed prep runs no clean-up); a live process's directory is kept."""
    for p in parent.glob(f"{prefix}*"):
        try:
            pid = int(p.name[len(prefix) :].split("-")[0])
        except ValueError:
            continue
        if not pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)


class DatasetWriter:
    """Writes a sharded dataset atomically.

    Use as a context manager: on an exception the temporary directory is removed and the
    target is left as it was; :meth:`commit` writes the manifest and renames the dataset
    into place.

    Parameters
    ----------
    out : path
        Target directory. Refused if it holds a dataset unless ``overwrite``; refused
        always if it holds anything else.
    splits : sequence of str
        The splits this dataset will have; each must end up with rows of both classes.
    has_group : bool
        Whether rows carry a ``group`` column.
    row_group_size, rows_per_file : int
        Parquet row-group size and the number of rows after which a class's part file
        is closed and the next one started.
    compression : str
        Parquet codec: ``"lz4"`` (default: as small as snappy on these columns and a
        third faster to decode), ``"snappy"``, ``"zstd"``, ``"none"``, ...
    standardize : int or None
        The number of features, to standardise them: the mean and standard deviation of
        every feature are accumulated over the rows appended to ``train`` and, at
        :meth:`commit`, every file is rewritten as ``(x - mean) / scale`` and the map
        stored in the manifest (``preprocessing.standardize``). Meant for dense
        features: centring stores every feature of every row.
    """

    def __init__(
        self,
        out: str | os.PathLike,
        *,
        splits=SPLITS,
        has_group: bool = False,
        overwrite: bool = False,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        rows_per_file: int = DEFAULT_ROWS_PER_FILE,
        compression: str = "lz4",
        standardize: int | None = None,
    ):
        if row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size}")
        if rows_per_file < row_group_size:
            raise ValueError(
                f"rows_per_file must be >= row_group_size ({row_group_size}), "
                f"got {rows_per_file}"
            )
        for s in splits:
            if s not in SPLITS:
                raise ValueError(f"unknown split {s!r}; expected one of {SPLITS}")
        self.remote = None  # (fsspec filesystem, root) of an object-store target
        self._replacing = False  # an object-store target holds a committed dataset
        if "://" in str(out) and not str(out).startswith("file://"):
            from bigrate.data.reader import filesystem

            self.remote = filesystem(str(out))
            self.out = Path(posixpath.basename(self.remote[1].rstrip("/")) or "dataset")
        else:
            self.out = Path(str(out).removeprefix("file://")).absolute()
        self.target = str(out) if self.remote else str(self.out)
        self.splits = tuple(splits)
        self.has_group = has_group
        self.row_group_size = int(row_group_size)
        self.rows_per_file = int(rows_per_file)
        self.compression = compression
        self.overwrite = overwrite
        self._check_target()
        # Object stores have no rename: an overwrite uploads its parts under new keys
        # (a generation suffix), so the old manifest and every file it names stay
        # readable until the new manifest replaces it in one PUT.
        self._suffix = "." + secrets.token_hex(4) if self._replacing else ""
        if self.remote:  # parts are staged in the local temp directory, then uploaded
            staging = Path(tempfile.gettempdir())
            _remove_stale_temporaries(staging, "bigrate-prep-")
            self.tmp = Path(
                tempfile.mkdtemp(prefix=f"bigrate-prep-{os.getpid()}-", dir=staging)
            )
        else:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temporaries(self.out.parent, f".{self.out.name}.tmp-")
            self.tmp = Path(
                tempfile.mkdtemp(
                    prefix=f".{self.out.name}.tmp-{os.getpid()}-", dir=self.out.parent
                )
            )
        self._lock = threading.Lock()
        self._open: list[_PartWriter] = []
        self._streams: dict[tuple[str, str], ClassStream] = {}
        self.files: list[ShardFile] = []
        self._moments = None if standardize is None else RunningMoments(standardize)
        self._done = False

    def _check_target(self) -> None:
        if self.remote:
            self._check_remote_target()
            return
        out = self.out
        if not out.exists():
            return
        if not out.is_dir():
            raise DatasetExistsError(f"{out}: exists and is not a directory")
        if (out / MANIFEST).exists():
            if not self.overwrite:
                raise DatasetExistsError(
                    f"{out}: already holds a dataset (manifest.json); "
                    "pass --overwrite (overwrite=True) to replace it"
                )
        elif any(out.iterdir()):
            raise DatasetExistsError(
                f"{out}: exists, is not empty and is not a bigrate dataset; "
                "refusing to write into it (choose an empty or new directory)"
            )

    def _check_remote_target(self) -> None:
        fs, root = self.remote
        self._replacing = fs.exists(root + "/" + MANIFEST)
        if self._replacing:
            if not self.overwrite:
                raise DatasetExistsError(
                    f"{self.target}: already holds a dataset (manifest.json); "
                    "pass --overwrite (overwrite=True) to replace it"
                )
            return
        try:
            present = fs.find(root)
        except FileNotFoundError:
            present = []
        strays = [p for p in present if not _PART_KEY.search(p)]
        if strays:
            raise DatasetExistsError(
                f"{self.target}: holds {len(strays)} object(s) that are not a bigrate "
                f"dataset (first: {strays[0]}); refusing to write into it (choose an "
                "empty or new prefix)"
            )

    def _upload(self, rel: str) -> None:
        """Copy the local ``tmp/rel`` to the remote target, then drop the local copy."""
        fs, root = self.remote
        try:
            fs.put_file(str(self.tmp / rel), root + "/" + rel)
        except OSError as e:
            raise DataError(f"upload failed: {e}", path=self.target + "/" + rel) from e
        (self.tmp / rel).unlink()

    # -- parts --------------------------------------------------------------------
    def _open_part(self, split: str, cls: str, index: int) -> _PartWriter:
        if split not in self.splits:
            raise ValueError(f"split {split!r} was not declared (have {self.splits})")
        if cls not in CLASSES:
            raise ValueError(f"unknown class {cls!r}; expected one of {CLASSES}")
        part = _PartWriter(
            self.tmp,
            f"{split}/{cls}/part-{index:05d}{self._suffix}.parquet",
            split,
            cls,
            self,
        )
        with self._lock:
            self._open.append(part)
        return part

    def _close_part(self, part: _PartWriter) -> None:
        info = part.close()
        if self.remote and self._moments is None:
            # streamed up now; with standardisation the file is rewritten at commit
            self._upload(info.path)
        with self._lock:
            self._open.remove(part)
            self.files.append(info)

    def stream(self, split: str, cls: str) -> ClassStream:
        """The rotating part stream of one (split, class); created on first use."""
        key = (split, cls)
        with self._lock:
            s = self._streams.get(key)
            if s is None:
                s = self._streams[key] = ClassStream(self, split, cls)
        return s

    def append(self, split: str, block: RowBlock) -> None:
        """Append a block of rows of both classes to ``split`` (routed by label)."""
        if self._moments is not None and split == "train":
            self._moments.update(block.X)
        pos = block.y == 1
        if pos.all():
            self.stream(split, "pos").append(block)
        elif not pos.any():
            self.stream(split, "neg").append(block)
        else:
            self.stream(split, "pos").append(block.take(pos))
            self.stream(split, "neg").append(block.take(~pos))

    def write_part(self, split: str, cls: str, index: int, block: RowBlock) -> None:
        """Write ``block`` whole as part file ``index`` of (split, cls); thread-safe."""
        if self._moments is not None:
            raise ValueError("standardize works with append(), not write_part()")
        part = self._open_part(split, cls, index)
        part.append(block)
        self._close_part(part)

    # -- finishing ----------------------------------------------------------------
    def commit(
        self,
        *,
        n_features: int,
        label_mapping: dict,
        preprocessing: dict,
        sources: list[dict],
        command: str | None = None,
        name: str | None = None,
        extra: dict | None = None,
    ) -> dict:
        """Close every file, check each split has both classes, write the manifest and
        rename the dataset into place. Returns the manifest."""
        for s in list(self._streams.values()):
            s.close()
        for part in list(self._open):
            self._close_part(part)
        rows = {s: {c: 0 for c in CLASSES} for s in self.splits}
        nnz = {s: {c: 0 for c in CLASSES} for s in self.splits}
        for f in self.files:
            rows[f.split][f.cls] += f.rows
            nnz[f.split][f.cls] += f.nnz
        for s in self.splits:
            for c in CLASSES:
                if rows[s][c] == 0:
                    raise DataError(
                        f"split {s!r} has no rows of class {c!r} "
                        f"(rows per split and class: {rows}); give that split a larger "
                        "fraction, drop it, or check the label mapping"
                    )
        if self._moments is not None:
            std = self._moments.standardizer()
            if std.n_features != n_features:
                raise ValueError(
                    f"standardize was set up for {std.n_features} features, the "
                    f"dataset has {n_features}"
                )
            self.files = [self._rewrite(f, std, n_features) for f in self.files]
            preprocessing = {**preprocessing, "standardize": std.to_json()}
        files = sorted(self.files, key=lambda f: f.path)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "name": name or self.out.name,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "bigrate_version": __version__,
            "n_features": int(n_features),
            "splits": list(self.splits),
            "rows": rows,
            "nnz": nnz,
            "row_group_size": self.row_group_size,
            "rows_per_file": self.rows_per_file,
            "compression": self.compression,
            "has_group": self.has_group,
            "label_mapping": label_mapping,
            "preprocessing": preprocessing,
            "sources": sources,
            "command": command if command is not None else _command_line(),
            "files": [f.to_json() for f in files],
        }
        if extra:
            manifest.update(extra)
        atomic_write_text(self.tmp / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        self._swap_into_place()
        self._done = True
        return manifest

    def _rewrite(self, f: ShardFile, std, n_features: int) -> ShardFile:
        """Part file ``f`` rewritten with its rows standardised (same rows, order and
        row groups), replacing the raw one."""
        src = self.tmp / f.path
        part = _PartWriter(self.tmp, f.path + ".std", f.split, f.cls, self)
        try:
            pf = pq.ParquetFile(src)
            for rb in pf.iter_batches(batch_size=self.row_group_size):
                b = table_to_block(rb, n_features, path=str(src))
                part.append(dataclasses.replace(b, X=std.apply(b.X)))
            info = part.close()
        except BaseException:
            part.abort()
            raise
        os.replace(self.tmp / info.path, src)
        return dataclasses.replace(info, path=f.path)

    def _swap_into_place(self) -> None:
        if self.remote:
            self._commit_remote()
            return
        if self.out.exists():
            self._check_target()  # still only a dataset or empty, and overwrite allowed
        replace_dir(self.tmp, self.out)

    def _commit_remote(self) -> None:
        fs, root = self.remote
        keep = {f.path for f in self.files}
        for f in self.files:
            if (self.tmp / f.path).exists():
                self._upload(f.path)
        self._upload(MANIFEST)  # the commit
        try:
            old = fs.find(root)
        except FileNotFoundError:
            old = []
        prefix = root.rstrip("/") + "/"
        for p in old:  # part files of a replaced dataset that the new one lacks
            rel = p[len(prefix) :] if p.startswith(prefix) else None
            if rel and rel not in keep and _PART_KEY.search(p):
                fs.rm_file(p)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def abort(self) -> None:
        """Remove everything written so far; the target is left untouched."""
        for part in list(self._open):
            part.abort()
        self._open.clear()
        if self.remote:  # best effort: the parts already uploaded (never a manifest)
            fs, root = self.remote
            for f in self.files:
                try:
                    fs.rm_file(root + "/" + f.path)
                except OSError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._done = True

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._done:
            self.abort()


# a part file's key: part-00012.parquet, or part-00012.<generation>.parquet when it
# was written by an overwrite of a committed dataset on an object store
_PART_KEY = re.compile(
    r"(^|/)(train|val|test)/(pos|neg)/part-\d+(\.[0-9a-f]{8})?\.parquet$"
)


def _command_line() -> str:
    argv = list(sys.argv)
    if argv:
        argv[0] = os.path.basename(argv[0])
    return " ".join(argv)
