"""Synthetic Percolator pin files of any size, drawn from the shared 10k-PSM file.

The shared file (mokapot's test data) is the model: its decoys stand for incorrect
matches, and its best targets (as many as there are more targets than decoys, ranked by a
cross-fitted logistic regression) for correct ones. A synthetic file is a sequence of
spectra whose sizes (PSMs per spectrum) follow the shared file's; a spectrum's first PSM
is a correct target with the shared file's share of correct spectra, and every other PSM
is an incorrect match, target or decoy with equal odds, drawn from the decoys. A drawn row
keeps its discrete features and gets a little Gaussian noise (5% of the column's standard
deviation) on its continuous ones, so no two synthetic rows are the same. All PSMs of a
spectrum share its ScanNr and ExpMass, as mokapot's target-decoy competition expects.

The file is written in blocks of spectra (bounded memory, any size), to a temporary name
renamed into place at the end; ``.gz`` names are gzip-compressed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from bigrate.data.prep.common import Progress

#: columns of a pin file that are not numeric measurements
_TEXT = ("SpecId", "Label", "ScanNr", "Peptide", "Proteins")


@dataclass(frozen=True)
class PinModel:
    """What a synthetic pin file is drawn from (see the module's text)."""

    columns: tuple[str, ...]  # the numeric columns, ExpMass first, in file order
    integer: tuple[bool, ...]  # a column whose values are all integers
    noise: np.ndarray  # per column: the standard deviation of the added noise
    incorrect: np.ndarray  # rows (n, len(columns)) drawn for incorrect matches
    correct: np.ndarray  # rows drawn for correct target matches
    spectrum_sizes: np.ndarray  # P(a spectrum has k PSMs) for k = 1, 2, ...
    correct_spectra: float  # share of spectra whose first PSM is a correct target


def pin_model(source: str | os.PathLike | None = None) -> PinModel:
    """The model of the shared 10k-PSM file (``source`` defaults to it)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.preprocessing import StandardScaler

    if source is None:
        from bigrate.data.prep import find_shared_data

        source = find_shared_data() / "psm_pin_mokapot_10k" / "10k_psms_test.pin.gz"
    t = pacsv.read_csv(str(source), parse_options=pacsv.ParseOptions(delimiter="\t"))
    for c in ("Label", "ScanNr", "ExpMass"):
        if c not in t.column_names:
            raise ValueError(f"{source}: not a pin file with a {c} column")
    cols = ["ExpMass"] + [
        c for c in t.column_names if c not in _TEXT and c != "ExpMass"
    ]
    M = np.column_stack([t.column(c).to_numpy().astype(np.float64) for c in cols])
    y = t.column("Label").to_numpy()
    scans = t.column("ScanNr").to_numpy()
    feats = M[:, 1:]
    score = np.empty(len(y))
    for tr, te in StratifiedKFold(3, shuffle=True, random_state=0).split(feats, y):
        sc = StandardScaler().fit(feats[tr])
        lr = LogisticRegression(max_iter=2000).fit(sc.transform(feats[tr]), y[tr])
        score[te] = lr.decision_function(sc.transform(feats[te]))
    targets, decoys = np.flatnonzero(y > 0), np.flatnonzero(y < 0)
    n_correct = max(len(targets) - len(decoys), 1)
    best = targets[np.argsort(-score[targets], kind="stable")[:n_correct]]
    integer = tuple(
        bool(np.all(M[:, j] == np.round(M[:, j]))) for j in range(len(cols))
    )
    continuous = np.array(
        [len(np.unique(M[:, j])) > 1000 and not integer[j] for j in range(len(cols))]
    )
    _, sizes = np.unique(scans, return_counts=True)
    return PinModel(
        columns=tuple(cols),
        integer=integer,
        noise=np.where(continuous, 0.05 * M.std(axis=0), 0.0),
        incorrect=M[decoys],
        correct=M[best],
        spectrum_sizes=np.bincount(sizes)[1:] / len(sizes),
        correct_spectra=n_correct / len(sizes),
    )


def _block(model: PinModel, rng, n_spectra: int, first_spec: int, first_psm: int):
    """The table of ``n_spectra`` spectra numbered from ``first_spec``."""
    k = 1 + rng.choice(len(model.spectrum_sizes), n_spectra, p=model.spectrum_sizes)
    n = int(k.sum())
    spectrum = np.repeat(np.arange(n_spectra), k)
    first = np.zeros(n, dtype=bool)
    first[np.cumsum(k) - k] = True
    correct = first & (rng.random(n_spectra) < model.correct_spectra)[spectrum]
    target = correct | (~correct & (rng.random(n) < 0.5))
    rows = np.where(
        correct[:, None],
        model.correct[rng.integers(len(model.correct), size=n)],
        model.incorrect[rng.integers(len(model.incorrect), size=n)],
    )
    rows = rows + rng.standard_normal(rows.shape) * model.noise
    rows[:, 0] = rows[np.cumsum(k) - k, 0][spectrum]  # one ExpMass a spectrum
    psm = first_psm + np.arange(n)
    data = {
        "SpecId": pa.array(psm),
        "Label": pa.array(np.where(target, 1, -1)),
        "ScanNr": pa.array(first_spec + spectrum),
    }
    for j, c in enumerate(model.columns):
        v = rows[:, j]
        data[c] = pa.array(
            np.round(v).astype(np.int64) if model.integer[j] else np.round(v, 6)
        )
    data["Peptide"] = pa.array(np.char.add(np.char.add("_.", psm.astype(str)), "._"))
    data["Proteins"] = pa.array(np.full(n, "_.synthetic._"))
    return pa.table(data, schema=_schema(model)), n


def _schema(model: PinModel) -> pa.Schema:
    """The columns of a synthetic pin file, in the shared file's order."""
    num = [(c, pa.int64() if i else pa.float64())
           for c, i in zip(model.columns, model.integer, strict=True)]  # fmt: skip
    return pa.schema([("SpecId", pa.int64()), ("Label", pa.int64()),
                      ("ScanNr", pa.int64()), *num, ("Peptide", pa.string()),
                      ("Proteins", pa.string())])  # fmt: skip


def write_synthetic_pin(
    out: str | os.PathLike,
    psms: int,
    *,
    seed: int = 0,
    model: PinModel | None = None,
    block_psms: int = 500_000,
    progress: bool = True,
) -> dict:
    """Write a pin file of about ``psms`` PSMs (whole spectra: at most one spectrum
    more) drawn from ``model`` (default: :func:`pin_model` of the shared file), seeded;
    returns {"psms", "spectra", "targets", "decoys", "path"}. The first PSMs of a
    larger file with the same seed and ``block_psms`` are those of a smaller one."""
    if psms < 1:
        raise ValueError(f"psms must be at least 1, got {psms}")
    model = model or pin_model()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    mean_k = float(
        np.dot(np.arange(1, len(model.spectrum_sizes) + 1), model.spectrum_sizes)
    )
    spectra_per_block = max(int(block_psms / mean_k), 1)
    prog = Progress("synthetic pin", enabled=progress)
    done = spectra = targets = 0
    try:
        sink = pa.OSFile(str(tmp), "wb")
        if out.suffix == ".gz":
            sink = pa.CompressedOutputStream(sink, "gzip")
        schema = _schema(model)
        with sink:
            # the header unquoted (Arrow quotes names; pin readers split on tabs)
            sink.write(("\t".join(schema.names) + "\n").encode())
            opts = pacsv.WriteOptions(
                include_header=False, delimiter="\t", quoting_style="none"
            )
            w = pacsv.CSVWriter(sink, schema, write_options=opts)
            block = 0
            while done < psms:
                rng = np.random.default_rng([seed, block])
                t, n = _block(model, rng, spectra_per_block, spectra, done)
                if done + n > psms:  # the last block: whole spectra up to psms
                    scan = t.column("ScanNr").to_numpy()
                    keep = int(np.searchsorted(scan, scan[psms - done - 1], "right"))
                    t, n = t.slice(0, keep), keep
                w.write_table(t)
                targets += int((t.column("Label").to_numpy() > 0).sum())
                spectra = int(t.column("ScanNr").to_numpy()[-1]) + 1
                done += n
                block += 1
                prog.update(n)
            w.close()
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    prog.close("done")
    return {"path": str(out), "psms": done, "spectra": spectra, "targets": targets,
            "decoys": done - targets}  # fmt: skip
