"""The ``bigrate`` command.

bigrate prep svmlight FILE... --out DIR     svmlight / LIBSVM text -> shards
bigrate prep csv FILE --label-column C ...  dense numeric CSV / TSV -> shards
bigrate prep pin FILE --out DIR             Percolator / mokapot pin -> shards
bigrate prep synth --rows N ... --out DIR   RCV1-shaped synthetic shards
bigrate prep recipe NAME --out DIR          a dataset of ../shared/data
bigrate info DIR [--verify] [--json]        the manifest's summary
bigrate warm [--estimator NAME]            compile the kernels into numba's cache (images, nodes)
bigrate train DIR --rho 0.05 [--engine dask|ray|local] [--out RUN]
                                            fit, evaluate Pfa/Pnd per split, save
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys

from bigrate.engines.base import ClusterLost
from bigrate.errors import DataError

#: exit status when the cluster was lost mid-run (a temporary failure: resume helps)
EXIT_CLUSTER_LOST = 75


def _labels(s: str | None):
    if s is None:
        return None
    return [x for x in (t.strip() for t in s.split(",")) if x]


def _add_common(p: argparse.ArgumentParser, split_default: str | None = None) -> None:
    p.add_argument("--out", required=True, help="output dataset directory")
    p.add_argument(
        "--split",
        default=split_default,
        help="fractions, e.g. train=0.8,val=0.1,test=0.1",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the stratified split")
    p.add_argument(
        "--l2-normalize", action="store_true", help="scale rows to unit L2 norm"
    )
    p.add_argument("--row-group-size", type=int, default=32_768)
    p.add_argument("--rows-per-file", type=int, default=262_144)
    p.add_argument(
        "--compression",
        default="lz4",
        choices=["snappy", "zstd", "lz4", "gzip", "none"],
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a dataset already at --out"
    )
    p.add_argument("--name", help="dataset name recorded in the manifest")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def _add_standardize(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--standardize",
        action="store_true",
        help="map every feature to (x - mean) / std, both computed on the train split "
        "only and stored in the manifest; models trained on the dataset apply the same "
        "map to the data they score",
    )


def _add_labels(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--positive-labels",
        help="comma-separated source labels of the positive "
        "class (default: 1 of {-1,+1} or {0,1})",
    )
    p.add_argument(
        "--negative-labels",
        help="comma-separated source labels of the negative "
        "class (default: every other label)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bigrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from bigrate._version import __version__

    ap.add_argument("--version", action="version", version=f"bigrate {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    prep = sub.add_parser("prep", help="convert data into Parquet shards")
    psub = prep.add_subparsers(dest="fmt", required=True)

    p = psub.add_parser(
        "svmlight", help="svmlight / LIBSVM files (.gz .bz2 .xz read too)"
    )
    p.add_argument("files", nargs="+")
    p.add_argument(
        "--test-files",
        nargs="+",
        default=[],
        help="files whose rows all go to the test split",
    )
    p.add_argument(
        "--zero-based", action="store_true", help="feature indices start at 0"
    )
    p.add_argument("--n-features", type=int, help="declared number of features")
    p.add_argument(
        "--chunk-mb",
        type=float,
        default=8.0,
        help="decompressed MiB parsed at a time (bounds memory)",
    )
    _add_labels(p)
    _add_common(p)

    p = psub.add_parser("csv", help="dense numeric CSV / TSV")
    p.add_argument("file")
    p.add_argument(
        "--label-column",
        required=True,
        help="column name (or 0-based index with --no-header; -1 = last)",
    )
    p.add_argument("--group-column", help="column of subpopulation names")
    p.add_argument(
        "--drop-columns", default="", help="comma-separated columns to ignore"
    )
    p.add_argument(
        "--no-header", action="store_true", help="the file has no header line"
    )
    p.add_argument(
        "--delimiter", default=",", help="field separator (use '\\t' for TSV)"
    )
    p.add_argument(
        "--skip-rows", type=int, default=0, help="lines to skip before the data"
    )
    p.add_argument(
        "--na-values", default=",NA,?", help="comma-separated missing markers"
    )
    p.add_argument(
        "--drop-missing", action="store_true", help="drop rows with missing cells"
    )
    p.add_argument(
        "--test-file", help="a file of the same layout that becomes the test split"
    )
    _add_labels(p)
    _add_standardize(p)
    _add_common(p)

    p = psub.add_parser("pin", help="Percolator / mokapot pin file (targets positive)")
    p.add_argument("file")
    p.add_argument(
        "--spectra",
        action="store_true",
        help="keep ScanNr as the group column, for target-decoy competition "
        "(bigrate predict --q)",
    )
    _add_standardize(p)
    _add_common(p)

    p = psub.add_parser(
        "synth-pin",
        help="write a synthetic pin FILE (not shards) drawn from the shared 10k-PSM "
        "file, any size",
    )
    p.add_argument("--psms", type=int, required=True, help="PSMs to write (about)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="the pin file (.gz: gzip)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")

    p = psub.add_parser("synth", help="RCV1-shaped synthetic sparse data, seeded")
    p.add_argument("--rows", type=int, default=804_414)
    p.add_argument("--features", type=int, default=47_236)
    p.add_argument("--nnz", type=float, default=76.0, help="mean word draws per row")
    p.add_argument("--neg-fraction", type=float, default=0.15)
    p.add_argument("--label-noise", type=float, default=0.01)
    p.add_argument("--jobs", type=int, default=None, help="threads (default: up to 4)")
    p.add_argument("--block-rows", type=int, default=65_536)
    _add_common(p, split_default="train=0.8,val=0.1,test=0.1")

    p = psub.add_parser("recipe", help="a dataset of ../shared/data by name")
    p.add_argument("dataset", help="e.g. a9a, spambase, sonar, psm_pin_mokapot_10k")
    p.add_argument("--shared", help="the shared data folder (default: ../shared/data)")
    p.add_argument(
        "--no-standardize",
        dest="standardize",
        action="store_false",
        default=None,
        help="keep the raw feature values (dense sets are standardised by default, "
        "with the train split's mean and standard deviation)",
    )
    _add_common(p)

    p = sub.add_parser("train", help="train a rate-constrained learner on shards")
    p.add_argument("data", help="shard dataset directory (or fsspec URL)")
    p.add_argument(
        "--estimator",
        default="NeymanPearsonSGD",
        help="any estimator a train job runs (default NeymanPearsonSGD; see the "
        "README's Jobs section)",
    )
    p.add_argument("--rho", type=float, help="target false-alarm rate (NP)")
    p.add_argument("--q", type=float, help="target q-value (QValueSGD)")
    p.add_argument("--epochs", type=int)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other estimator parameter (repeatable)",
    )
    p.add_argument(
        "--engine",
        default="dask",
        choices=["local", "dask", "ray"],
        help="dask / ray: an embedded cluster on 127.0.0.1 unless --address",
    )
    p.add_argument(
        "--address",
        help="existing Dask scheduler (tcp://host:8786) or Ray cluster (host:6379)",
    )
    p.add_argument("--workers", type=int, help="embedded cluster size")
    p.add_argument(
        "--memory-limit",
        help="each worker's memory limit of an embedded Dask cluster, e.g. 1.5GiB "
        "(its row-group cache is a quarter of it)",
    )
    p.add_argument(
        "--out",
        help="the run directory (model/, metrics.json, events; default runs/train-<time>)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace a model already in --out"
    )
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("run", help="run a job file (train, sweep, evaluate)")
    p.add_argument("job", help="job file (TOML)")
    p.add_argument(
        "--engine", choices=["local", "dask", "ray"], help="override [engine] name"
    )
    p.add_argument(
        "--address",
        help="existing cluster: tcp://host:8786 (Dask), "
        "host:6379 or ray://host:10001 (Ray)",
    )
    p.add_argument("--out", help="override [output] dir (the run directory's parent)")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("resume", help="continue an interrupted run")
    p.add_argument("run_dir")
    p.add_argument("--engine", choices=["local", "dask", "ray"])
    p.add_argument("--address")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("runs", help="list run directories and their state")
    p.add_argument("dir", nargs="?", default="runs", help="folder of runs (runs)")
    p = sub.add_parser("status", help="state of a run directory")
    p.add_argument("run_dir")

    p = sub.add_parser("predict", help="score a dataset with a run's model")
    p.add_argument("run_dir", help="run directory (or a saved model directory)")
    p.add_argument("data", help="shard dataset directory")
    p.add_argument("--out", required=True, help="output Parquet file")
    p.add_argument(
        "--splits", default=None, help="comma-separated splits (default all)"
    )
    p.add_argument(
        "--q",
        type=float,
        help="also print the targets accepted at this q-value ((decoys + 1) / "
        "targets), after target-decoy competition when the data has spectra",
    )

    p = sub.add_parser("report", help="PNG plots and an HTML page for a run")
    p.add_argument("run_dir")

    p = sub.add_parser(
        "warm",
        help="compile every estimator's kernels into numba's cache (for images and "
        "cluster nodes)",
    )
    p.add_argument(
        "--estimator",
        action="append",
        default=None,
        help="only this estimator (repeatable; default: all)",
    )

    p = sub.add_parser("info", help="print a dataset's manifest summary")
    p.add_argument("path")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also check every file's sha256 and decode every row against the manifest",
    )
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    return ap


def _common_kw(a) -> dict:
    return dict(
        split=a.split,
        seed=a.seed,
        l2_normalize=a.l2_normalize,
        row_group_size=a.row_group_size,
        rows_per_file=a.rows_per_file,
        compression=a.compression,
        overwrite=a.overwrite,
        progress=not a.quiet,
        name=a.name,
        command=_command(),
    )


def _command() -> str:
    return "bigrate " + " ".join(shlex.quote(x) for x in sys.argv[1:])


def _prep(a) -> int:
    if a.fmt == "synth-pin":
        from bigrate.data.prep.synth_pin import write_synthetic_pin

        r = write_synthetic_pin(a.out, a.psms, seed=a.seed, progress=not a.quiet)
        print(f"wrote {r['psms']:,} PSMs ({r['targets']:,} targets, {r['decoys']:,} "
              f"decoys) of {r['spectra']:,} spectra to {r['path']}")  # fmt: skip
        return 0
    from bigrate.data import ShardedDataset
    from bigrate.data.prep import (
        prep_csv,
        prep_pin,
        prep_svmlight,
        prep_synth,
        run_recipe,
    )

    kw = _common_kw(a)
    if a.fmt == "svmlight":
        prep_svmlight(
            a.files,
            a.out,
            test_files=a.test_files,
            zero_based=a.zero_based,
            n_features=a.n_features,
            chunk_bytes=int(a.chunk_mb * 2**20),
            positive_labels=_labels(a.positive_labels),
            negative_labels=_labels(a.negative_labels),
            **kw,
        )
    elif a.fmt == "csv":
        delim = "\t" if a.delimiter in ("\\t", "tab") else a.delimiter
        prep_csv(
            a.file,
            a.out,
            label_column=a.label_column,
            group_column=a.group_column,
            drop_columns=_labels(a.drop_columns) or [],
            header=not a.no_header,
            delimiter=delim,
            skip_rows=a.skip_rows,
            na_values=a.na_values.split(","),
            drop_missing=a.drop_missing,
            test_file=a.test_file,
            positive_labels=_labels(a.positive_labels),
            negative_labels=_labels(a.negative_labels),
            standardize=a.standardize,
            **kw,
        )
    elif a.fmt == "pin":
        prep_pin(a.file, a.out, spectra=a.spectra, standardize=a.standardize, **kw)
    elif a.fmt == "synth":
        kw.pop("l2_normalize")  # synthetic rows are always L2-normalised
        prep_synth(
            a.out,
            rows=a.rows,
            features=a.features,
            nnz=a.nnz,
            neg_fraction=a.neg_fraction,
            label_noise=a.label_noise,
            jobs=a.jobs,
            block_rows=a.block_rows,
            **kw,
        )
    elif a.fmt == "recipe":
        run_recipe(a.dataset, a.out, shared=a.shared, standardize=a.standardize, **kw)
    if not a.quiet:
        print(ShardedDataset(a.out).summary())
    return 0


def _value(text: str):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _train(a) -> int:
    from bigrate.runner.train import train

    params = {}
    for item in a.param:
        if "=" not in item:
            raise ValueError(f"--param expects NAME=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        params[k.strip()] = _value(v.strip())
    for k in ("rho", "q", "epochs"):
        if getattr(a, k) is not None:
            params[k] = getattr(a, k)
    run, metrics = train(
        a.data,
        a.estimator,
        params,
        engine=a.engine,
        address=a.address,
        workers=a.workers,
        memory_limit=a.memory_limit,
        out=a.out,
        overwrite=a.overwrite,
        progress=not a.quiet,
    )
    _print_outcome(run, metrics)
    return 0


def _run(a) -> int:
    from bigrate.runner.job import start
    from bigrate.runner.spec import load_job

    spec = load_job(a.job, {"engine": a.engine, "address": a.address, "output": a.out})
    run, metrics = start(spec, progress=not a.quiet)
    _print_outcome(run, metrics)
    return 0


def _resume(a) -> int:
    from bigrate.runner.job import resume

    run, metrics = resume(
        a.run_dir,
        progress=not a.quiet,
        overrides={"engine": a.engine, "address": a.address},
    )
    _print_outcome(run, metrics)
    return 0


def _print_outcome(run, metrics) -> None:
    from bigrate.runner.status import format_metrics

    print(format_metrics(metrics))
    print(f"run directory: {run.path}")


def _status(a) -> int:
    from bigrate.runner.status import status_text

    print(status_text(a.run_dir))
    return 0


def _runs(a) -> int:
    from bigrate.runner.status import runs_text

    print(runs_text(a.dir))
    return 0


def _predict(a) -> int:
    from bigrate.runner.predict import accepted_at_q, predict

    n = predict(a.run_dir, a.data, a.out, splits=_labels(a.splits))
    print(f"wrote {n:,} scores to {a.out}")
    if a.q is not None:
        r = accepted_at_q(a.out, a.q)
        among = (
            f"the best PSMs of {r['groups']:,} spectra"
            if r["groups"]
            else f"{r['rows']:,} rows"
        )
        print(f"accepted at q = {a.q:g}: {r['accepted']:,} targets among {among}")
    return 0


def _report(a) -> int:
    from bigrate.runner.report import make_report

    page = make_report(a.run_dir)
    print(f"report: {page}")
    return 0


def _warm(a) -> int:
    import time

    from bigrate.runner.warm import cache_dir, warm

    t = time.perf_counter()
    rows = warm(a.estimator)
    for r in rows:
        what = f"error: {r['error']}" if r["error"] else "compiled or loaded"
        print(f"{r['estimator']:<28}{r['seconds']:>8.2f} s  {what}")
    print(f"numba cache: {cache_dir()} ({time.perf_counter() - t:.1f} s in all)")
    return 1 if any(r["error"] for r in rows) else 0


def _info(a) -> int:
    from bigrate.data import ShardedDataset

    ds = ShardedDataset(a.path, verify=a.verify)
    if not a.verify:
        ds.check()  # sizes and Parquet footers against the manifest
    if a.json:
        print(json.dumps(ds.manifest, indent=2))
    else:
        print(ds.summary())
        if a.verify:
            print(
                f"verified     sha256, rows, non-zeros and feature indices of "
                f"{len(ds.files())} files match the manifest"
            )
    return 0


def _run_failed(a, e: Exception) -> int:
    """A run that failed: one line and where its traceback is (the run's events), exit
    status 1; an error outside a run is raised (a traceback: a bug)."""
    where = getattr(e, "run_path", None)
    if a.cmd not in ("run", "resume", "train") or where is None:
        raise e
    print(
        f"bigrate: error: {type(e).__name__}: {e}\n"
        f"  the run failed; its traceback is in {where}/events.jsonl (run_failed), "
        f"and `bigrate status {shlex.quote(where)}` says whether resuming can help",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if getattr(a, "run_dir", None):  # runs/NAME-LATEST: the newest complete run of NAME
        if "-LATEST" in str(a.run_dir):
            from bigrate.rundir import resolve_latest

            try:
                a.run_dir = str(resolve_latest(a.run_dir))
            except FileNotFoundError as e:
                print(f"bigrate: error: {e}", file=sys.stderr)
                return 2
    from bigrate.runner import interrupt

    interrupt.install()  # Ctrl-C and SIGTERM: an interruption (exit 128 + signal)
    try:
        if a.cmd == "prep":
            return _prep(a)
        if a.cmd == "warm":
            return _warm(a)
        if a.cmd == "info":
            return _info(a)
        handlers = {
            "train": _train,
            "run": _run,
            "resume": _resume,
            "status": _status,
            "runs": _runs,
            "predict": _predict,
            "report": _report,
        }
        if a.cmd in handlers:
            rc = handlers[a.cmd](a)
            interrupt.check()  # a signal swallowed on the way still ends in 128 + it
            return rc
    except (DataError, FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"bigrate: error: {e}", file=sys.stderr)
        return 2
    except ClusterLost as e:  # the scheduler or head went away mid-run
        from bigrate.runner.job import lost_message

        line = lost_message(e) if getattr(e, "run_path", None) else str(e)
        print(f"bigrate: {line}", file=sys.stderr)
        return EXIT_CLUSTER_LOST
    except RuntimeError as e:
        from bigrate.rundir import RunLockedError

        if isinstance(e, RunLockedError):
            print(f"bigrate: error: {e}", file=sys.stderr)
            return 2
        return _run_failed(a, e)
    except ConnectionError as e:  # an engine address that cannot be reached
        print(f"bigrate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from bigrate.runner.job import RunInterrupted

        sig = interrupt.received()
        what = "interrupted" + (" (SIGTERM)" if sig == signal.SIGTERM else "")
        if isinstance(e, RunInterrupted):
            saved = (
                f"training checkpoint after round {e.checkpoint}"
                if e.checkpoint is not None
                else "finished work"
            )
            print(
                f"bigrate: {what}; {saved} is saved. Continue with:\n"
                f"  bigrate resume {shlex.quote(e.run_path)}",
                file=sys.stderr,
            )
        elif a.cmd in ("run", "resume", "train"):
            print(
                f"bigrate: {what} before the run started; nothing to resume",
                file=sys.stderr,
            )
        else:
            print(f"bigrate: {what}; nothing was left half-written", file=sys.stderr)
        return 128 + sig
    except BrokenPipeError:  # e.g. `bigrate info DIR --json | head`
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - a failed run: one line (see _run_failed)
        return _run_failed(a, e)
    ap.error(f"unknown command {a.cmd}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
