"""The same work timed on two commits of bigrate, in one run (for rewrites that must
keep the speed: issue 49's "within 5% in the same run").

    python benchmarks/bench_versions.py --old REV [--new REV] [--repeats 5] [--out DIR]

Each commit is checked out into a temporary git worktree; every timing runs in a
fresh subprocess that imports that worktree's bigrate (its own numba cache, warmed by
a first run that is not counted), alternating old and new so that a machine's drift
hits both alike. The work, on the shared sets:

- ``quantile a9a``: QuantilePathSVC(alpha=1e-3) on all of a9a (the BENCHMARKS
  quantile table's last row), and on its first 8,000 rows;
- ``quantile synthetic``: the synthetic Gaussian 10,000 x 20 set;
- ``bpsp``: BPSPSearchCV with its defaults on 150 standardised spambase rows, 5 folds
  (one of the BENCHMARKS BPSP table's kind of row, small enough to repeat).

Prints and writes ``versions.json`` (medians and fastest runs, and their new / old
ratios).
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
SHARED = REPO.parent / "shared" / "data"

WORK = {
    "quantile a9a": """
from sklearn.datasets import load_svmlight_file
X, y = load_svmlight_file(SHARED + "/a9a/a9a.bz2", n_features=123)
from bigrate import QuantilePathSVC
QuantilePathSVC(alpha=1e-3).fit(X[:100], y[:100])
t = time.perf_counter(); m = QuantilePathSVC(alpha=1e-3).fit(X, y)
out["seconds"] = time.perf_counter() - t; out["kinks"] = int(m.n_kinks_)
""",
    "quantile a9a 8000": """
from sklearn.datasets import load_svmlight_file
X, y = load_svmlight_file(SHARED + "/a9a/a9a.bz2", n_features=123)
from bigrate import QuantilePathSVC
QuantilePathSVC(alpha=1e-3).fit(X[:100], y[:100])
t = time.perf_counter(); m = QuantilePathSVC(alpha=1e-3).fit(X[:8000], y[:8000])
out["seconds"] = time.perf_counter() - t; out["kinks"] = int(m.n_kinks_)
""",
    "quantile synthetic": """
rng = np.random.default_rng(0)
X = rng.standard_normal((10_000, 20)); w = rng.standard_normal(20)
y = np.where(X @ w + 2.0 * rng.standard_normal(10_000) > 0, 1, -1)
from bigrate import QuantilePathSVC
QuantilePathSVC(alpha=1e-3).fit(X[:100], y[:100])
t = time.perf_counter(); m = QuantilePathSVC(alpha=1e-3).fit(X, y)
out["seconds"] = time.perf_counter() - t; out["kinks"] = int(m.n_kinks_)
""",
    "bpsp": """
from sklearn.preprocessing import StandardScaler
D = np.loadtxt(SHARED + "/spambase/spambase.tsv.gz", delimiter="\\t", skiprows=1)
rng = np.random.default_rng(0); idx = rng.choice(len(D), 150, replace=False)
X = StandardScaler().fit_transform(D[idx, :-1]); y = np.where(D[idx, -1] > 0, 1, -1)
from bigrate import BPSPSearchCV
BPSPSearchCV(gamma=[0.1], cv=2, engine="local", lambda_min=0.2, progress=False).fit(X[:30], y[:30])
t = time.perf_counter()
s = BPSPSearchCV(gamma=[0.1], cv=5, engine="local", progress=False).fit(X, y)
out["seconds"] = time.perf_counter() - t; out["cv_error"] = float(s.cv_error_)
""",
}

PRELUDE = """
import json, sys, time
import numpy as np
SHARED = {shared!r}
out = {{}}
"""


def run(tree: Path, what: str, timeout: float) -> dict:
    code = (
        PRELUDE.format(shared=str(SHARED)) + WORK[what] + "\nprint(json.dumps(out))\n"
    )
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, text=True,
                       capture_output=True, timeout=timeout)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"{what} at {tree}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def worktree(rev: str, root: Path) -> Path:
    path = root / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path),
                    rev], check=True, capture_output=True)  # fmt: skip
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="HEAD",
                    help='a revision, or "." for this checkout as it is')  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--work", nargs="*", default=list(WORK), choices=list(WORK))
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(HERE / "out"))
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bigrate-versions-"))
    trees = {}
    try:
        for label, rev in (("old", a.old), ("new", a.new)):
            trees[label] = REPO if rev == "." else worktree(rev, root)
        res = {}
        for what in a.work:
            for label in ("old", "new"):  # compile into each tree's cache, uncounted
                run(trees[label], what, a.timeout)
            got = {"old": [], "new": []}
            for r in range(a.repeats):
                order = ("old", "new") if r % 2 == 0 else ("new", "old")
                for label in order:
                    got[label].append(run(trees[label], what, a.timeout))
            med = {
                k: float(np.median([g["seconds"] for g in v])) for k, v in got.items()
            }
            same = {k: v for k, v in got["new"][0].items() if k != "seconds"}
            assert same == {k: v for k, v in got["old"][0].items() if k != "seconds"}, (
                what, got["old"][0], got["new"][0])  # fmt: skip
            best = {k: float(np.min([g["seconds"] for g in v])) for k, v in got.items()}
            res[what] = {"old_s": med["old"], "new_s": med["new"],
                         "new_over_old": med["new"] / med["old"],
                         "old_min_s": best["old"], "new_min_s": best["new"],
                         "new_over_old_min": best["new"] / best["old"], **same,
                         "all_s": {k: [g["seconds"] for g in v] for k, v in got.items()}}  # fmt: skip
            print(
                f"{what:20s} old {med['old']:8.3f} s  new {med['new']:8.3f} s  "
                f"new/old {med['new'] / med['old']:.3f}  {same}",
                flush=True,
            )
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"old": a.old, "new": a.new, "repeats": a.repeats, "results": res}
        (out / "versions.json").write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        for path in trees.values():
            if path == REPO:
                continue
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(path)], capture_output=True)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
