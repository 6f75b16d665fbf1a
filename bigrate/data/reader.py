"""Reading a sharded dataset: manifest, per-file listing, streaming CSR batches."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bigrate.data import pages
from bigrate.data.format import (
    CLASS_LABEL,
    CLASSES,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    RowBlock,
    ShardFile,
    arrays_to_block,
    check_column_types,
    table_to_block,
)
from bigrate.data.standardize import Standardizer
from bigrate.errors import ChecksumError, DataError


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel


_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
# storage options that are credentials: only ever given as "${ENV_NAME}", so that job
# files, run directories, logs and task arguments hold the variable's name, not the secret
SECRET_OPTIONS = frozenset(
    {"key", "secret", "token", "password", "aws_access_key_id",
     "aws_secret_access_key", "aws_session_token", "session_token"}
)  # fmt: skip


def check_storage_options(options, where: str = "storage_options") -> list[str]:
    """Problems of a storage-options table: a dict of scalars or tables, whose
    credential entries (:data:`SECRET_OPTIONS`) name an environment variable as
    ``"${NAME}"`` instead of holding the secret."""
    if not isinstance(options, dict):
        return [f"{where}: must be a table, got {type(options).__name__}"]
    problems = []
    for k, v in options.items():
        if isinstance(v, dict):
            problems += check_storage_options(v, f"{where}.{k}")
        elif k.lower() in SECRET_OPTIONS and not (
            isinstance(v, str) and _ENV_REF.match(v)
        ):
            problems.append(
                f"{where}.{k}: a credential is never written in a job; name the "
                f'environment variable that holds it, e.g. "${{AWS_SECRET_ACCESS_KEY}}"'
            )
    return problems


def resolve_storage_options(options: dict | None, where: str = "storage_options"):
    """The options with every ``"${NAME}"`` replaced by that environment variable of
    this process (on a worker: the worker's environment)."""
    out = {}
    for k, v in (options or {}).items():
        if isinstance(v, dict):
            out[k] = resolve_storage_options(v, f"{where}.{k}")
        elif isinstance(v, str) and _ENV_REF.match(v):
            name = _ENV_REF.match(v).group(1)
            if name not in os.environ:
                raise DataError(
                    f"{where}.{k} names the environment variable {name}, which is "
                    f"not set on {socket.gethostname()} (pid {os.getpid()})"
                )
            out[k] = os.environ[name]
        else:
            out[k] = v
    return out


def filesystem(path: str, storage_options: dict | None = None):
    """(fsspec filesystem, path within it) for a local path or any fsspec URL; a
    protocol whose package is missing is one line naming what to install."""
    import fsspec.core

    if "://" in path:
        opts = resolve_storage_options(storage_options)
        try:
            return fsspec.core.url_to_fs(path, **opts)
        except ImportError as e:
            from fsspec.registry import known_implementations

            proto = path.split("://", 1)[0]
            hint = known_implementations.get(proto, {}).get("err") or str(e)
            raise DataError(
                f"no filesystem for {proto}:// here: {hint}", path=path
            ) from None
        except ValueError as e:
            raise DataError(str(e), path=path) from None
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem(), os.path.abspath(path)


@dataclass(frozen=True)
class DatasetRef:
    """Where a dataset is, as tasks carry it to workers: its path or URL and its
    storage options *unresolved* (credentials as ``"${NAME}"``), so no secret ever
    travels in a task or lands in a run directory."""

    path: str
    storage_options: tuple = ()  # ((key, value), ...) of a JSON-able dict, sorted

    @classmethod
    def make(cls, path, storage_options: dict | None = None):
        if not storage_options:
            return str(path)
        return cls(str(path), tuple(sorted(json.loads(json.dumps(
            storage_options)).items())))  # fmt: skip

    def options(self) -> dict:
        return dict(self.storage_options)

    def __str__(self) -> str:
        return self.path


_FOOTERS: OrderedDict = OrderedDict()  # (file URL, sha256) -> (metadata, layout)
_FOOTERS_MAX = 65_536
_FOOTER_LOCK = threading.Lock()
_POOL = None


# row groups a stream keeps being fetched ahead of the one it reads, on object storage
# (bigrate.linear.sampler reads it at each refill; the environment sets it for workers).
# A fetch waits a request's latency plus its transfer while the steps take ~20 ms a row
# group of a cheap epoch: 2 ahead left part of a 20 ms latency showing (BENCHMARKS)
READ_AHEAD = int(os.environ.get("BIGRATE_READ_AHEAD", "4"))


def _fetch_pool():
    """This process's threads that fetch row groups ahead: enough for two class
    streams' read-ahead (made on first use, so a forked or spawned worker makes its
    own; made again larger if READ_AHEAD grew)."""
    global _POOL, _POOL_PID, _POOL_THREADS
    threads = max(4, 2 * READ_AHEAD)
    if _POOL is None or _POOL_PID != os.getpid() or _POOL_THREADS < threads:
        from concurrent.futures import ThreadPoolExecutor

        if _POOL is not None and _POOL_PID == os.getpid():
            _POOL.shutdown(wait=False)  # its fetches finish; new ones go to the new
        _POOL_PID, _POOL_THREADS = os.getpid(), threads
        _POOL = ThreadPoolExecutor(threads, thread_name_prefix="bigrate-fetch")
    return _POOL


_POOL_PID = None
_POOL_THREADS = 0


def _row_groups(shard, n_groups: int, row_groups, full: str) -> list[int]:
    """The row groups asked for (None: all), each checked to be in the file."""
    rg = list(range(n_groups)) if row_groups is None else list(row_groups)
    if any(not 0 <= g < n_groups for g in rg):
        raise DataError(
            f"row groups {rg} asked for, the file has {n_groups} "
            f"(manifest.json records {shard.row_groups}): the manifest and the "
            "file disagree",
            path=full,
        )
    return rg


def is_dataset(X) -> bool:
    """Is X a ShardedDataset or a path to one (rather than an array)?"""
    return isinstance(X, (ShardedDataset, DatasetRef, str, os.PathLike))


class ShardedDataset:
    """A sparse binary dataset stored as Parquet shards with a manifest.

    Parameters
    ----------
    path : str or os.PathLike
        The dataset directory (local, or an fsspec URL such as ``s3://bucket/data``).
    verify : bool, default False
        Recompute every file's sha256 now and raise :class:`~bigrate.ChecksumError`
        naming the first file that does not match the manifest.

    Examples
    --------
    >>> ds = ShardedDataset("data/a9a")                        # doctest: +SKIP
    >>> ds.n_features, ds.class_counts("train")                # doctest: +SKIP
    (123, {'pos': 17796, 'neg': 5646})
    >>> for batch in ds.iter_batches("train", batch_rows=8192):  # doctest: +SKIP
    ...     batch.X, batch.y                                     # CSR float32, int8
    """

    def __init__(
        self,
        path: str | os.PathLike | DatasetRef,
        *,
        verify: bool = False,
        storage_options: dict | None = None,
    ):
        if isinstance(path, DatasetRef):
            storage_options = {**path.options(), **(storage_options or {})}
            path = path.path
        self.path = str(path)
        #: the options as given (credentials as "${NAME}"): what tasks carry
        self.storage_options = dict(storage_options or {})
        problems = check_storage_options(self.storage_options)
        if problems:
            raise ValueError("; ".join(problems))
        self.fs, self.root = filesystem(self.path, self.storage_options)
        mpath = _join(self.root, MANIFEST)
        try:  # one open (a HEAD and a GET on S3), no existence check before it
            raw = self.fs.cat_file(mpath)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            remote = "://" in self.path and not self.path.startswith("file://")
            raise FileNotFoundError(
                f"{self.path}: no committed {MANIFEST} here; this is not a bigrate "
                "dataset"
                + (
                    " (a prep to object storage uploads the manifest last: one that "
                    "did not finish leaves none; re-run it)"
                    if remote
                    else " (make one with `bigrate prep ...`)"
                )
            ) from None
        except (OSError, ValueError) as e:  # e.g. credentials refused, no endpoint
            raise DataError(f"cannot read {MANIFEST}: {e}", path=self.path) from None
        try:
            manifest = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(
                f"not valid JSON: {e}", path=mpath, line=getattr(e, "lineno", None)
            ) from e
        if manifest.get("format") != FORMAT_NAME:
            raise DataError(
                f"format is {manifest.get('format')!r}, expected {FORMAT_NAME!r}",
                path=mpath,
            )
        if manifest.get("format_version") != FORMAT_VERSION:
            raise DataError(
                f"format_version {manifest.get('format_version')!r} is not supported "
                f"(this bigrate reads version {FORMAT_VERSION})",
                path=mpath,
            )
        self.manifest = manifest
        #: the manifest's bytes hashed: which commit of the dataset this handle reads
        self.manifest_sha256 = hashlib.sha256(raw).hexdigest()
        self.n_features = int(manifest["n_features"])
        self.splits = tuple(manifest["splits"])
        self.has_group = bool(manifest.get("has_group", False))
        self._files = [ShardFile.from_json(f, self.path) for f in manifest["files"]]
        std = manifest.get("preprocessing", {}).get("standardize")
        #: the per-feature map the rows were standardised with (None: raw values)
        self.standardizer = (
            None
            if std is None
            else Standardizer.from_json(std, self.n_features, str(mpath))
        )
        if verify:
            self.verify()

    @property
    def ref(self):
        """What a task carries to a worker to open this dataset there: the path, or a
        :class:`DatasetRef` when there are storage options."""
        return DatasetRef.make(self.path, self.storage_options)

    # -- description ----------------------------------------------------------------
    def __repr__(self) -> str:
        counts = ", ".join(
            f"{s}: {c['pos']}+/{c['neg']}-" for s, c in self.manifest["rows"].items()
        )
        return f"ShardedDataset({self.path!r}, n_features={self.n_features}, {counts})"

    def class_counts(self, split: str = "train") -> dict[str, int]:
        """Rows of each class in ``split``: ``{"pos": n_pos, "neg": n_neg}``."""
        self._check_split(split)
        return dict(self.manifest["rows"][split])

    def n_rows(self, split: str = "train") -> int:
        c = self.class_counts(split)
        return c["pos"] + c["neg"]

    def files(
        self, split: str | None = None, classes: Iterable[str] | str | None = None
    ) -> list[ShardFile]:
        """The shard files of a split and classes (all when None), in manifest order."""
        if split is not None:
            self._check_split(split)
        cls = self._check_classes(classes)
        return [
            f
            for f in self._files
            if (split is None or f.split == split) and f.cls in cls
        ]

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(
                f"split {split!r} is not in this dataset (have {self.splits})"
            )

    @staticmethod
    def _check_classes(classes) -> tuple[str, ...]:
        if classes is None:
            return CLASSES
        if isinstance(classes, str):
            classes = (classes,)
        classes = tuple(classes)
        for c in classes:
            if c not in CLASSES:
                raise ValueError(f"unknown class {c!r}; expected 'pos' and/or 'neg'")
        return classes

    # -- reading ----------------------------------------------------------------------
    def open_file(self, shard: ShardFile) -> pq.ParquetFile:
        """The Parquet file of ``shard``; a missing or unreadable file is a DataError
        naming it."""
        full = _join(self.root, shard.path)
        try:
            return pq.ParquetFile(self.fs.open(full, "rb"))
        except FileNotFoundError:
            raise DataError(
                "file listed in the manifest is missing", path=full
            ) from None
        except (pa.ArrowException, OSError, ValueError) as e:
            raise DataError(
                f"not a readable Parquet file ({type(e).__name__}: {e}); re-run the "
                "prep",
                path=full,
            ) from None

    # -- object storage: footers kept, row groups fetched ahead ------------------------
    def _footer(self, shard: ShardFile):
        """(footer metadata, decoder layout or None) of a shard file, read once per
        process (keyed by the file's URL and sha256) and its column types checked."""
        full = _join(self.root, shard.path)
        key = (full, shard.sha256)
        with _FOOTER_LOCK:
            hit = _FOOTERS.get(key)
            if hit is not None:
                _FOOTERS.move_to_end(key)
                return hit
        pf = self.open_file(shard)
        try:
            cols = pages.layout(pf)
            if cols is not None:
                check_column_types(pf.schema_arrow, full)
            got = (pf.metadata, cols)
        finally:
            pf.close()
        with _FOOTER_LOCK:
            _FOOTERS[key] = got
            while len(_FOOTERS) > _FOOTERS_MAX:
                _FOOTERS.popitem(last=False)
        return got

    def _fetch(self, shard: ShardFile, g: int):
        """Row group ``g`` of a remote shard as a :class:`pages.RangeBuffer`: one ranged
        request (the footer from the process's cache), or None where the decoder here
        does not read the file's layout."""
        meta, cols = self._footer(shard)
        if cols is None or not 0 <= g < meta.num_row_groups:
            return None
        try:
            lo, hi = pages.row_group_range(meta, g, cols)
        except pages.Unsupported:
            return None
        full = _join(self.root, shard.path)
        try:
            return pages.RangeBuffer(lo, self.fs.cat_file(full, start=lo, end=hi))
        except FileNotFoundError:
            raise DataError(
                "file listed in the manifest is missing", path=full
            ) from None
        except OSError as e:
            raise DataError(f"cannot be read: {e}", path=full) from None

    def prefetch(self, shard: ShardFile, g: int):
        """Start fetching row group ``g`` of ``shard`` in the background (object
        storage only; None on a local disk, where the page cache reads ahead): a
        future to hand to :meth:`iter_file` as ``fetched={g: future}``."""
        if self.is_local:
            return None
        return _fetch_pool().submit(self._fetch, shard, g)

    def iter_file(
        self,
        shard: ShardFile,
        batch_rows: int = 65_536,
        row_groups: Iterable[int] | None = None,
        with_group: bool = False,
        fetched: dict | None = None,
    ) -> Iterator[RowBlock]:
        """CSR batches of one shard file (optionally only some of its row groups).

        Row groups in the shard format's own layout are decoded by
        :mod:`bigrate.data.pages` (a row group at a time, then cut into batches);
        others, and the ``group`` column, by pyarrow. Either way every row group is
        checked before it is yielded."""
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
        full = _join(self.root, shard.path)
        label = CLASS_LABEL.get(shard.cls)
        if not self.is_local and not (with_group and self.has_group):
            yield from self._iter_remote(shard, batch_rows, row_groups, fetched or {})
            return
        pf = self.open_file(shard)
        try:
            rg = _row_groups(shard, pf.metadata.num_row_groups, row_groups, full)
            grouped = with_group and self.has_group
            cols = None if grouped else pages.layout(pf)
            if cols is None:
                yield from self._arrow_batches(pf, rg, batch_rows, grouped, full, label)
                return
            check_column_types(pf.schema_arrow, full)
            with self.fs.open(full, "rb") as f:
                for g in rg:
                    try:
                        *parts, checked = pages.read_row_group(
                            f, pf.metadata, g, cols, self.n_features, full
                        )
                    except pages.Unsupported:
                        yield from self._arrow_batches(
                            pf, [g], batch_rows, grouped, full, label
                        )
                        continue
                    block = arrays_to_block(
                        *parts,
                        self.n_features,
                        path=full,
                        label=label,
                        rows_checked=checked,
                    )
                    for a in range(0, len(block), batch_rows):
                        yield block.slice(a, min(a + batch_rows, len(block)))
        finally:
            pf.close()

    def _iter_remote(self, shard, batch_rows, row_groups, fetched):
        """:meth:`iter_file` on object storage: the footer from the process's cache
        and each row group by one ranged request (or the prefetch's), decoded here;
        files in another layout through pyarrow."""
        full = _join(self.root, shard.path)
        meta, cols = self._footer(shard)
        rg = _row_groups(shard, meta.num_row_groups, row_groups, full)
        label = CLASS_LABEL.get(shard.cls)
        for g in rg:
            fut = fetched.pop(g, None)
            buf = fut.result() if fut is not None else self._fetch(shard, g)
            parts = None
            if buf is not None:
                try:
                    *parts, checked = pages.read_row_group(
                        buf, meta, g, cols, self.n_features, full
                    )
                except pages.Unsupported:
                    parts = None
            if parts is None:
                pf = self.open_file(shard)
                try:
                    yield from self._arrow_batches(
                        pf, [g], batch_rows, False, full, label
                    )
                finally:
                    pf.close()
                continue
            block = arrays_to_block(
                *parts, self.n_features, path=full, label=label, rows_checked=checked
            )
            for a in range(0, len(block), batch_rows):
                yield block.slice(a, min(a + batch_rows, len(block)))

    def _arrow_batches(self, pf, rg, batch_rows, grouped, full, label):
        """Batches of the row groups ``rg`` decoded by pyarrow."""
        cols = ["row_id", "label", "indices", "values"] + (["group"] if grouped else [])
        batches = pf.iter_batches(batch_size=batch_rows, row_groups=rg, columns=cols)
        while True:
            try:
                rb = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError, KeyError) as e:
                raise DataError(
                    f"cannot be decoded ({type(e).__name__}: {e}); re-run the prep",
                    path=full,
                ) from None
            yield table_to_block(rb, self.n_features, path=full, label=label)

    def iter_batches(
        self,
        split: str = "train",
        classes: Iterable[str] | str | None = None,
        batch_rows: int = 65_536,
        *,
        files: Iterable[ShardFile] | None = None,
        with_group: bool = False,
    ) -> Iterator[RowBlock]:
        """Stream ``split`` as :class:`RowBlock` batches (``.X`` CSR float32, ``.y`` int8,
        ``.row_id``, ``.group``) of at most ``batch_rows`` rows, file by file (all of
        ``pos`` then all of ``neg`` by default). Memory is bounded by one batch plus one
        Parquet row group."""
        todo = list(files) if files is not None else self.files(split, classes)
        for shard in todo:
            yield from self.iter_file(shard, batch_rows, with_group=with_group)

    def to_csr(
        self,
        split: str = "train",
        classes: Iterable[str] | str | None = None,
        *,
        order: str = "row_id",
        with_group: bool | None = None,
    ) -> RowBlock:
        """The whole split in memory as one :class:`RowBlock`.

        ``order="row_id"`` sorts rows by ``row_id`` (the source order for data made by
        ``bigrate prep``); ``order="file"`` keeps the file order (pos then neg).
        """
        if order not in ("row_id", "file"):
            raise ValueError(f"order must be 'row_id' or 'file', got {order!r}")
        wg = self.has_group if with_group is None else with_group
        blocks = list(
            self.iter_batches(split, classes, batch_rows=1 << 20, with_group=wg)
        )
        if not blocks:
            raise DataError(
                f"split {split!r} has no rows for classes {classes}", path=self.path
            )
        out = RowBlock.concat(blocks)
        if out.X.shape[1] != self.n_features:
            out.X.resize((len(out), self.n_features))
        if order == "row_id" and len(out) and np.any(np.diff(out.row_id) < 0):
            out = out.take(np.argsort(out.row_id, kind="stable"))
        return out

    @property
    def is_local(self) -> bool:
        """Whether the files are on a local disk (where reading footers is cheap)."""
        protocol = self.fs.protocol
        return "file" in (protocol if isinstance(protocol, tuple) else (protocol,))

    def check(self, files: bool = True) -> None:
        """Cheap consistency checks of the files against the manifest (no data read):
        every listed file exists with the recorded size, its Parquet footer holds the
        recorded rows and row groups and the shard schema (``files``: a request or
        two a file on object storage), and the files add up to the manifest's row
        counts. Raises :class:`DataError` naming the file."""
        totals: dict = {}
        for shard in self._files:
            key = (shard.split, shard.cls)
            totals[key] = totals.get(key, 0) + shard.rows
            if not files:
                continue
            full = _join(self.root, shard.path)
            try:
                size = self.fs.size(full)
            except FileNotFoundError:
                raise DataError(
                    "file listed in the manifest is missing", path=full
                ) from None
            if size != shard.bytes:
                raise DataError(
                    f"file is {size:,} bytes, the manifest records {shard.bytes:,} "
                    "(truncated or replaced; re-run the prep)",
                    path=full,
                )
            pf = self.open_file(shard)
            try:
                md = pf.metadata
                if md.num_rows != shard.rows or md.num_row_groups != shard.row_groups:
                    raise DataError(
                        f"Parquet footer has {md.num_rows:,} rows in "
                        f"{md.num_row_groups} row groups, the manifest records "
                        f"{shard.rows:,} in {shard.row_groups}",
                        path=full,
                    )
                names = set(pf.schema_arrow.names)
                missing = {"row_id", "label", "indices", "values"} - names
                if missing:
                    raise DataError(
                        f"missing column(s) {sorted(missing)} of the shard format",
                        path=full,
                    )
                check_column_types(pf.schema_arrow, path=full)
            finally:
                pf.close()
        for split, counts in self.manifest.get("rows", {}).items():
            for cls, n in counts.items():
                if totals.get((split, cls), 0) != n:
                    raise DataError(
                        f"rows[{split!r}][{cls!r}] is {n:,} but its files hold "
                        f"{totals.get((split, cls), 0):,}",
                        path=_join(self.root, MANIFEST),
                    )

    def verify(self) -> None:
        """Everything :meth:`check` does, then recompute every file's sha256 and decode
        every row (indices below ``n_features``, sorted and unique, finite values, the
        file's label), counting rows and non-zeros against the manifest. Raises
        :class:`ChecksumError` or :class:`DataError` naming the file."""
        for shard in self._files:
            if not self.fs.exists(_join(self.root, shard.path)):
                raise ChecksumError(
                    "file listed in the manifest is missing",
                    path=_join(self.root, shard.path),
                )
            full = _join(self.root, shard.path)
            h = hashlib.sha256()
            with self.fs.open(full, "rb") as f:
                while True:
                    chunk = f.read(1 << 22)
                    if not chunk:
                        break
                    h.update(chunk)
            if h.hexdigest() != shard.sha256:
                raise ChecksumError(
                    f"sha256 is {h.hexdigest()}, the manifest records {shard.sha256}; "
                    "the file was modified or corrupted (re-run the prep)",
                    path=full,
                )
        self.check()
        for shard in self._files:
            full = _join(self.root, shard.path)
            rows = nnz = 0
            for b in self.iter_file(shard, 1 << 16):
                rows += len(b)
                nnz += b.X.nnz
            if rows != shard.rows or nnz != shard.nnz:
                raise DataError(
                    f"holds {rows:,} rows and {nnz:,} non-zeros, the manifest records "
                    f"{shard.rows:,} and {shard.nnz:,}",
                    path=full,
                )

    def summary(self) -> str:
        """A human-readable summary of the manifest (what `bigrate info` prints)."""
        m = self.manifest
        lines = [
            f"dataset      {m.get('name')}  ({self.path})",
            f"format       {m['format']} v{m['format_version']}, created {m.get('created')} "
            f"by bigrate {m.get('bigrate_version')}",
            f"features     {self.n_features}",
            f"{'split':<8}{'pos':>12}{'neg':>12}{'total':>12}{'neg share':>11}{'nnz/row':>10}",
        ]
        for s in self.splits:
            c = m["rows"][s]
            n = c["pos"] + c["neg"]
            nnz = sum(m["nnz"][s].values())
            lines.append(
                f"{s:<8}{c['pos']:>12,}{c['neg']:>12,}{n:>12,}{c['neg'] / max(n, 1):>11.3f}"
                f"{nnz / max(n, 1):>10.1f}"
            )
        lm = m.get("label_mapping", {})
        lines.append(
            f"labels       positive <- {lm.get('positive')}, negative <- "
            f"{lm.get('negative')}"
        )
        pre = m.get("preprocessing", {})
        split = pre.get("split", {})
        fr = ", ".join(f"{k} {v:g}" for k, v in split.get("fractions", {}).items())
        extra = split.get("test_files") or []
        lines.append(
            f"split rule   {fr} (seed {split.get('seed')})"
            + (f"; test from {', '.join(extra)}" if extra else "")
        )
        lines.append(
            f"preprocess   l2_normalize={pre.get('l2_normalize')}"
            + (
                f", standardised (mean and std of {self.standardizer.n_rows:,} train "
                "rows)"
                if self.standardizer is not None
                else ""
            )
            + (
                f", {pre['rows_dropped_for_missing_values']} rows dropped "
                "for missing values"
                if pre.get("rows_dropped_for_missing_values")
                else ""
            )
        )
        total = sum(f.bytes for f in self._files)
        lines.append(
            f"files        {len(self._files)} Parquet files, {total / 2**20:.1f} MiB, "
            f"row groups of {m.get('row_group_size')} rows"
            + (", with group column" if self.has_group else "")
        )
        for src in m.get("sources", []):
            lines.append(f"source       {src['name']}  sha256 {src['sha256'][:16]}...")
        lines.append(f"command      {m.get('command')}")
        return "\n".join(lines)
