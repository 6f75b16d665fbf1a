"""The shipped q-value job on the mokapot pin file against the simple baselines
(issue: quality where users compare).

    python benchmarks/bench_psm_job.py [--out benchmarks/out]

Prepares ``psm_pin_mokapot_10k`` twice (the recipe's default standardisation, and
``--no-standardize``), runs ``jobs/psm_qvalue.toml`` as shipped on each (the real
`bigrate run` command), and counts the test targets accepted at q = 0.01 next to, on
the same splits:
  * logistic regression (scikit-learn) on the standardised features, C chosen on val;
  * the single best raw feature, feature and sign chosen on train (and, optimistic,
    chosen on test itself).
Prints a table and saves ``psm_job.json`` in --out.

    python benchmarks/bench_psm_job.py --seeds 5

The job's stability instead (issue 48, item 4): for seeds 0..N-1 a new stratified split
(``prep recipe --seed``) and the job run with ``random_state`` = seed, beside logistic
regression (standardised features, C chosen on val) on the same split; prints each
seed, the mean and the spread, and saves ``psm_job_seeds.json``.

    python benchmarks/bench_psm_job.py --seeds 5 --crossfit

The whole file rescored as mokapot does: ``jobs/psm_rescore.toml`` (a crossfit job,
every PSM scored by the model of the folds that did not hold it) over seeds 0..N-1,
beside logistic regression on the same folds; saves ``psm_crossfit_seeds.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def cli(*args, cwd) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "bigrate.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    if p.returncode != 0:
        raise RuntimeError(f"bigrate {args[:2]} failed:\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def run_job(work: Path, data: Path, seed: int | None = None) -> dict:
    job = (REPO / "jobs/psm_qvalue.toml").read_text()
    job = job.replace('path = "data/psm"', f'path = "{data}"')
    if seed is not None:
        old = "params = { q = 0.01, epochs = 20 }"
        assert old in job, "the shipped job's params line changed"
        job = job.replace(old, old[:-2] + f", random_state = {seed} }}")
    spec = work / f"job-{data.name}.toml"
    spec.write_text(job)
    out = cli("run", spec, cwd=work)
    run_dir = Path(re.findall(r"run directory:? (\S+)", out)[-1])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {s: v["accepted"] for s, v in metrics["evaluation"].items()}


def logistic_regression(S: dict, q: float) -> dict:
    """scikit-learn's logistic regression on the splits ``S``, C chosen on val by the
    targets accepted at ``q``; test counts at that C and at the default C = 1."""
    from sklearn.linear_model import LogisticRegression

    from bigrate.metrics import positives_at_q

    def acc(y, f):
        return int(positives_at_q(y, f, q))

    best_c, best_val = None, -1
    for c in (0.001, 0.01, 0.1, 1.0, 10.0):
        lr = LogisticRegression(C=c, max_iter=2000).fit(S["train"].X, S["train"].y)
        v = acc(S["val"].y, lr.decision_function(S["val"].X))
        if v > best_val:
            best_c, best_val = c, v
    lr = LogisticRegression(C=best_c, max_iter=2000).fit(S["train"].X, S["train"].y)
    lr1 = LogisticRegression(max_iter=2000).fit(S["train"].X, S["train"].y)
    return {
        "C": best_c,
        "val": best_val,
        "test": acc(S["test"].y, lr.decision_function(S["test"].X)),
        "test_default_C": acc(S["test"].y, lr1.decision_function(S["test"].X)),
    }


def summary(v) -> dict:
    """Mean, spread (sd, ddof 1) and range of counts over seeds."""
    import numpy as np

    v = np.asarray(v, dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)),
            "min": int(v.min()), "max": int(v.max())}  # fmt: skip


def report(res: dict, keys, path: Path) -> None:
    """Print the summaries ``res[k]`` of ``keys`` and save ``res`` as ``path``."""
    for k in keys:
        m = res[k]
        print(f"{k:>30}: mean {m['mean']:.1f}, sd {m['sd']:.1f}, "
              f"range {m['min']}-{m['max']}")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(f"saved {path}")


def seeds(n: int, q: float, out: Path) -> None:

    from bigrate.data import ShardedDataset

    work = Path(tempfile.mkdtemp(prefix="psmseeds-"))
    rows = []
    for seed in range(n):
        data = work / f"seed{seed}"
        cli("prep", "recipe", "psm_pin_mokapot_10k", "--out", data, "--quiet",
            "--seed", seed, cwd=work)  # fmt: skip
        job = run_job(work, data, seed=seed)
        ds = ShardedDataset(data)
        S = {s: ds.to_csr(s) for s in ("train", "val", "test")}
        lr = logistic_regression(S, q)
        rows.append({"seed": seed, "job": job["test"], "logistic_regression": lr,
                     "test_targets": int((S["test"].y > 0).sum())})  # fmt: skip
        print(f"  seed {seed}: job {job['test']}, logistic regression "
              f"{lr['test']} (C={lr['C']:g}; {lr['test_default_C']} at C = 1)", flush=True)  # fmt: skip

    res = {
        "q": q,
        "seeds": rows,
        "job": summary([r["job"] for r in rows]),
        "logistic_regression": summary(
            [r["logistic_regression"]["test"] for r in rows]
        ),
        "logistic_regression_default_C": summary(
            [r["logistic_regression"]["test_default_C"] for r in rows]
        ),
        "job_minus_lr": summary(
            [r["job"] - r["logistic_regression"]["test"] for r in rows]
        ),
    }
    keys = ("job", "logistic_regression", "logistic_regression_default_C",
            "job_minus_lr")  # fmt: skip
    report(res, keys, out / "psm_job_seeds.json")


def run_crossfit_job(work: Path, data: Path, seed: int) -> dict:
    """``jobs/psm_rescore.toml`` as shipped on ``data``, its folds and the SGD seeded
    by ``seed`` (the real `bigrate run`); its metrics.json."""
    job = (REPO / "jobs/psm_rescore.toml").read_text()
    job = job.replace('path = "data/psm"', f'path = "{data}"')
    old = "params = { q = 0.01, epochs = 20 }"
    assert old in job and "folds = 3" in job, "the shipped job's lines changed"
    job = job.replace(old, old[:-2] + f", random_state = {seed} }}")
    job = job.replace("folds = 3", f"folds = 3\nseed = {seed}")
    spec = work / f"rescore-{seed}.toml"
    spec.write_text(job)
    out = cli("run", spec, cwd=work)
    run_dir = Path(re.findall(r"run directory:? (\S+)", out)[-1])
    return json.loads((run_dir / "metrics.json").read_text())


def crossfit(n: int, q: float, out: Path) -> None:
    """The whole file rescored as mokapot does (issue 48, item 4): for seeds 0..N-1,
    ``jobs/psm_rescore.toml`` (3 folds, each PSM scored by the model of the other two)
    beside logistic regression (scikit-learn, C = 1, as mokapot's default model is a
    linear SVM without a search here) fitted on the same folds, its scores put on one
    scale the same way (divided by the spread of its scores on the fold's training
    decoys) and, as the other common way, by z-scores of the scored fold's decoys.
    Targets accepted at q over all 10,000 PSMs (targets with q-value <= q, decoys /
    targets)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from bigrate.data import ShardedDataset
    from bigrate.metrics import positives_at_q
    from bigrate.runner.crossfit import crossfit_folds, pooled_rows

    work = Path(tempfile.mkdtemp(prefix="psmcf-"))
    data = work / "psm"
    cli("prep", "recipe", "psm_pin_mokapot_10k", "--out", data, "--quiet", cwd=work)
    ds = ShardedDataset(data)
    rows = pooled_rows(ds, list(ds.splits))
    X, y = rows["X"].toarray(), rows["y"]
    out_rows = []
    for seed in range(n):
        m = run_crossfit_job(work, data, seed)
        f_sd, f_z = np.empty(len(y)), np.empty(len(y))
        for tr, te in crossfit_folds(y, None, 3, seed):  # the job's folds
            lr = LogisticRegression(max_iter=2000).fit(X[tr], y[tr])
            s = lr.decision_function(X[te])
            f_sd[te] = s / np.std(lr.decision_function(X[tr][y[tr] < 0]))
            d = s[y[te] < 0]
            f_z[te] = (s - d.mean()) / d.std()
        r = {
            "seed": seed,
            "job": m["evaluation"]["all"]["accepted"],
            "job_fit_seconds": m["fit_seconds"],
            "logistic_regression": positives_at_q(y, f_sd, q),
            "logistic_regression_decoy_z": positives_at_q(y, f_z, q),
        }
        out_rows.append(r)
        print(f"  seed {seed}: job {r['job']}, logistic regression "
              f"{r['logistic_regression']} (decoy z-scores "
              f"{r['logistic_regression_decoy_z']})", flush=True)  # fmt: skip

    res = {
        "q": q,
        "psms": int(len(y)),
        "targets": int((y > 0).sum()),
        "seeds": out_rows,
    }
    keys = ("job", "logistic_regression", "logistic_regression_decoy_z")
    for k in keys:
        res[k] = summary([r[k] for r in out_rows])
    report(res, keys, out / "psm_crossfit_seeds.json")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--q", type=float, default=0.01)
    ap.add_argument("--seeds", type=int, default=0,
                    help="run the stability study over this many seeds instead")  # fmt: skip
    ap.add_argument("--crossfit", action="store_true",
                    help="with --seeds: the cross-fit job over the whole file")  # fmt: skip
    a = ap.parse_args()
    if a.seeds and a.crossfit:
        return crossfit(a.seeds, a.q, Path(a.out))
    if a.seeds:
        return seeds(a.seeds, a.q, Path(a.out))

    from bigrate.data import ShardedDataset
    from bigrate.metrics import positives_at_q

    work = Path(tempfile.mkdtemp(prefix="psmjob-"))
    res: dict = {"q": a.q}
    for name, extra in (("standardised", []), ("raw", ["--no-standardize"])):
        cli("prep", "recipe", "psm_pin_mokapot_10k", "--out", work / name, "--quiet",
            *extra, cwd=work)  # fmt: skip
        res[f"job_{name}"] = run_job(work, work / name)

    std, raw = ShardedDataset(work / "standardised"), ShardedDataset(work / "raw")
    S = {s: std.to_csr(s) for s in ("train", "val", "test")}
    R = {s: raw.to_csr(s) for s in ("train", "val", "test")}

    def acc(y, f):
        return int(positives_at_q(y, f, a.q))

    res["logistic_regression"] = logistic_regression(S, a.q)
    best_c = res["logistic_regression"]["C"]

    def single(split):
        X = R[split].X.toarray()
        return {
            (j, sgn): acc(R[split].y, sgn * X[:, j])
            for j in range(X.shape[1])
            for sgn in (1, -1)
        }

    tr, te = single("train"), single("test")
    j, sgn = max(tr, key=tr.get)
    names = raw.manifest["preprocessing"]["feature_columns"]
    res["best_single_feature"] = {
        "chosen_on_train": {"feature": names[j], "sign": sgn, "test": te[(j, sgn)]},
        "chosen_on_test": max(te.values()),
    }
    print(f"targets accepted at q = {a.q} (test split: "
          f"{int((S['test'].y > 0).sum())} targets, {int((S['test'].y < 0).sum())} decoys)")  # fmt: skip
    print(
        f"  jobs/psm_qvalue.toml, standardised recipe : {res['job_standardised']['test']}"
    )
    print(f"  jobs/psm_qvalue.toml, raw features         : {res['job_raw']['test']}")
    print(f"  logistic regression (standardised, C={best_c:g}) : "
          f"{res['logistic_regression']['test']}; at its default C = 1: "
          f"{res['logistic_regression']['test_default_C']}")  # fmt: skip
    b = res["best_single_feature"]
    print(f"  best single raw feature ({b['chosen_on_train']['feature']}, chosen on "
          f"train): {b['chosen_on_train']['test']}; best on test itself: "
          f"{b['chosen_on_test']}")  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "psm_job.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"saved {out / 'psm_job.json'}")


if __name__ == "__main__":
    main()
