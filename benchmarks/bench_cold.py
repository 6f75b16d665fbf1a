"""Each estimator's first fit in a fresh process with an empty numba cache (what a new
container, cluster node or Ray worker pays), then in a fresh process with that cache
filled (issue 47, item 3: at most 5 s cold).

    python benchmarks/bench_cold.py [--old REV] [--new REV] [--repeats 3] [--cores 0]

Every timing is its own subprocess, pinned to the given cores (``taskset``), with
``NUMBA_CACHE_DIR`` a new empty directory; the same process's second fit is not
counted: a second process with the cache that the first filled gives the warm figure.
The fit is the one ``bigrate warm`` makes (400 random sparse rows of 20 features, 40
for BPSPSearchCV), timed alone. The SGD learners are also timed fitted from shards
(512 rows written as a shard set to a temporary directory, not timed): the shard
reader's kernels and the steps that read rows in the decoded row groups, what a
cluster worker's rounds compile. ``--old REV`` times another commit too, from a
temporary git worktree, alternating old and new. Prints and writes ``cold.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_versions import worktree  # noqa: E402

ESTIMATORS = (
    "NeymanPearsonSGD", "QValueSGD", "NeymanPearsonSVC", "CostSensitiveSVC",
    "AUMLinearClassifier", "QuantilePathSVC", "RateConstrainedClassifier",
    "BPSPSearchCV",
)  # fmt: skip
STREAMED = ("NeymanPearsonSGD", "QValueSGD")

# the fit ``bigrate warm`` makes, timed alone (a child process, one estimator)
IN_MEMORY = """
import json, sys, time
from bigrate.model_selection.sweep import warm_task
from bigrate.runner.registry import entry
name = sys.argv[1]
e = entry(name)
cls = e.load()
valid = cls().get_params()
params = {k: v for k, v in {"engine": "local", "progress": False}.items() if k in valid}
r = warm_task(cls, params, 20, rows=40 if name == "BPSPSearchCV" else 400,
              dense=e.data == "dense")
print(json.dumps({"seconds": r["seconds"], "error": r["error"]}))
"""

# an SGD learner fitted from shards written first (not timed)
FROM_SHARDS = """
import json, sys, tempfile, time, warnings
import numpy as np, scipy.sparse as sp
import bigrate
from bigrate.data.format import RowBlock
from bigrate.data.writer import DatasetWriter
tmp = tempfile.mkdtemp(prefix="bigrate-cold-")
X = sp.random(512, 20, density=0.3, format="csr", dtype=np.float32, random_state=0)
y = np.where(np.arange(512) % 2 == 0, 1, -1).astype(np.int8)
with DatasetWriter(tmp + "/ds", splits=("train",), row_group_size=128) as w:
    w.append("train", RowBlock(X=X.tocsr(), y=y, row_id=np.arange(512)))
    w.commit(n_features=20, label_mapping={}, preprocessing={}, sources=[])
t = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    getattr(bigrate, sys.argv[1])(epochs=1).fit(tmp + "/ds")
print(json.dumps({"seconds": time.perf_counter() - t, "error": None}))
import shutil; shutil.rmtree(tmp, ignore_errors=True)
"""


def run(tree: Path, code: str, name: str, cache: Path, cores: str) -> float:
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin",
           "NUMBA_CACHE_DIR": str(cache)}  # fmt: skip
    cmd = ["taskset", "-c", cores, sys.executable, "-c", code, name]
    p = subprocess.run(cmd, cwd=tree, env=env, text=True, capture_output=True,
                       timeout=1800)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"{name} at {tree}: {p.stderr[-2000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    if got["error"]:
        raise RuntimeError(f"{name} at {tree}: {got['error']}")
    return float(got["seconds"])


def cold_and_warm(tree: Path, code: str, name: str, cores: str) -> tuple:
    cache = Path(tempfile.mkdtemp(prefix="bigrate-numba-"))
    try:
        return run(tree, code, name, cache, cores), run(tree, code, name, cache, cores)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="another revision, timed alternately")
    ap.add_argument("--new", default=".",
                    help='a revision, or "." for this checkout as it is')  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--estimators", nargs="*", default=list(ESTIMATORS),
                    choices=ESTIMATORS)  # fmt: skip
    ap.add_argument("--cores", default="0", help="taskset's list of cores")
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bigrate-cold-"))
    revs = {"new": a.new, **({"old": a.old} if a.old else {})}
    trees = {}
    try:
        for label, rev in revs.items():
            trees[label] = REPO if rev == "." else worktree(rev, root)
        rows = [(n, IN_MEMORY, "") for n in a.estimators]
        rows += [
            (n, FROM_SHARDS, " from shards") for n in a.estimators if n in STREAMED
        ]
        res = {}
        for name, code, how in rows:
            got = {label: [] for label in trees}
            for r in range(a.repeats):
                order = list(trees) if r % 2 == 0 else list(trees)[::-1]
                for label in order:
                    got[label].append(cold_and_warm(trees[label], code, name, a.cores))
            res[name + how] = {
                label: {
                    "cold_s": [c for c, _ in v], "warm_s": [w for _, w in v],
                    "cold_median_s": float(np.median([c for c, _ in v])),
                    "warm_median_s": float(np.median([w for _, w in v])),
                }
                for label, v in got.items()
            }  # fmt: skip
            print(name + how, "  ".join(
                f"{label}: cold {min(x['cold_s']):.2f}-{max(x['cold_s']):.2f} s, warm "
                f"{x['warm_median_s']:.2f} s" for label, x in res[name + how].items()
            ), flush=True)  # fmt: skip
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"revisions": revs, "repeats": a.repeats, "cores": a.cores,
               "results": res}  # fmt: skip
        (out / "cold.json").write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        for path in trees.values():
            if path != REPO:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(path)], capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
