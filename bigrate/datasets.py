"""Loaders for the public sets in ``../shared/data`` that are used in memory (tests,
benchmarks) rather than as shards."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
)  # fmt: skip
_NUMERIC = (0, 2, 4, 10, 11, 12)


def _read_adult(path: Path, skip_first: bool):
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, rec in enumerate(csv.reader(f, skipinitialspace=True), 1):
            if skip_first and lineno == 1 or not rec or not "".join(rec).strip():
                continue
            if len(rec) != 15:
                raise ValueError(
                    f"{path}:{lineno}: expected 15 comma-separated fields, "
                    f"got {len(rec)}"
                )
            rows.append(rec)
    return rows


def load_adult(shared: str | Path):
    """UCI Adult from ``<shared>/adult``: one-hot categoricals (missing "?" is its own
    level), standardised numerics (train statistics), labels +1 for ">50K", and the
    "sex" column as the group. Returns {"train": (X, y, sex), "test": (X, y, sex),
    "feature_names": [...]}; X is CSR float64."""
    from sklearn.preprocessing import OneHotEncoder

    base = Path(shared) / "adult"
    tr = _read_adult(base / "adult.data.gz", False)
    te = _read_adult(base / "adult.test.gz", True)
    cat = [i for i in range(14) if i not in _NUMERIC]
    enc = OneHotEncoder(handle_unknown="ignore", sparse_output=True)
    enc.fit([[r[i] for i in cat] for r in tr])
    num_tr = np.array([[float(r[i]) for i in _NUMERIC] for r in tr])
    mu, sd = num_tr.mean(0), num_tr.std(0)
    out = {}
    for name, rows in (("train", tr), ("test", te)):
        num = (np.array([[float(r[i]) for i in _NUMERIC] for r in rows]) - mu) / sd
        oh = enc.transform([[r[i] for i in cat] for r in rows])
        X = sp.hstack([sp.csr_matrix(num), oh], format="csr").astype(np.float64)
        y = np.array([1 if r[14].rstrip(".") == ">50K" else -1 for r in rows])
        sex = np.array([r[9] for r in rows])
        out[name] = (X, y, sex)
    out["feature_names"] = [ADULT_COLUMNS[i] for i in _NUMERIC] + list(
        enc.get_feature_names_out([ADULT_COLUMNS[i] for i in cat])
    )
    return out
