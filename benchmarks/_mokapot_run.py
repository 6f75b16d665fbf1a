"""Run mokapot on a pin file and print accepted targets at q-value thresholds as JSON.

Run with the Python of an environment that has mokapot (it pins its own pandas/numba):
    python -m venv .mkenv && .mkenv/bin/pip install mokapot
    .mkenv/bin/python benchmarks/_mokapot_run.py FILE.pin.gz 0.0025 0.01 0.1
"""

import gzip
import json
import shutil
import sys
import tempfile
import time

import mokapot
import numpy as np


def main():
    path, qs = sys.argv[1], [float(q) for q in sys.argv[2:]]
    if path.endswith(".gz"):  # mokapot 0.10 reads gzip pin files in text mode and fails
        tmp = tempfile.NamedTemporaryFile(suffix=".pin", delete=False)
        with gzip.open(path, "rb") as src, tmp:
            shutil.copyfileobj(src, tmp)
        path = tmp.name
    t = time.perf_counter()
    psms = mokapot.read_pin(path)
    results, _models = mokapot.brew(psms, folds=3)
    seconds = time.perf_counter() - t
    table = results.confidence_estimates["psms"]
    qv = np.asarray(table["mokapot q-value"], dtype=float)
    out = {
        "mokapot_version": mokapot.__version__,
        "fit_s": seconds,
        "accepted": {str(q): int((qv <= q).sum()) for q in qs},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
