"""Job-layer benchmarks (issue: jobs).

    python benchmarks/bench_jobs.py [--rows 804414]

overhead: an NP training job through `bigrate run` vs calling the estimator directly on
          the same shards (local: the in-process `fit`, against the job's checkpointed
          rounds on the local engine; Dask: `fit_distributed` on 2 workers), with the
          test Pfa / Pnd of both; cluster start-up is read from the run's event log and
          reported separately.
sweep:    throughput (tasks/s) of a 12-point x 3-fold sweep on a9a with the local engine
          (sequential), Dask (2 workers) and Ray (2 CPUs), with batching of short
          tasks ([sweep] batch_seconds = 1, the default) and without (0), for tasks of
          5, 10 and 40 epochs (~20 ms, ~35 ms, ~120 ms); engine start-up, the
          workers' warm-up (imports and compiled kernels, on every engine, the local
          one included) and the driver's reading of the train split and putting it
          and the folds on the workers reported separately, with the whole job's
          wall time.

    python benchmarks/bench_jobs.py --only sweep

Writes benchmarks/out/jobs.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _job(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def _run(job: Path) -> tuple[float, Path]:
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "bigrate.cli", "run", str(job), "--quiet"],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    run = Path(p.stdout.strip().splitlines()[-1].split("run directory: ")[1])
    return wall, run


def _events(run: Path) -> dict:
    ev = {}
    for line in (run / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        ev.setdefault(e["event"], e)
    return ev


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=804_414)
    ap.add_argument("--out", default=str(HERE / "out"))
    ap.add_argument("--only", choices=["train", "sweep"])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each sweep")
    ap.add_argument(
        "--alphas",
        type=int,
        default=6,
        help="alphas in the grid (x 2 losses x 3 folds)",
    )
    ap.add_argument("--epochs", default="5,10,40", help="task lengths, in epochs")
    a = ap.parse_args()
    out = Path(a.out)
    work = out / "jobs"
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"rows": a.rows}
    if a.only != "sweep":
        _train(a, out, work, res)
    if a.only != "train":
        epoch_list = tuple(int(e) for e in a.epochs.split(","))
        _sweeps(out, work, res, a.repeats, a.alphas, epoch_list)
    from bigrate.files import atomic_write_text

    name = "jobs.json" if a.only is None else f"jobs_{a.only}.json"
    atomic_write_text(out / name, json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


def _train(a, out: Path, work: Path, res: dict) -> None:
    from bench_sgd import _synth

    from bigrate import NeymanPearsonSGD, ShardedDataset
    from bigrate.engines.dask import DaskEngine
    from bigrate.linear import fit_distributed

    data = _synth(out, a.rows)
    train = """
[job]
kind = "train"
name = "bench"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = 3, random_state = 0 }}
[engine]
name = "{engine}"
workers = 2
[output]
dir = "{out}"
"""
    ds = ShardedDataset(data)
    for engine in ("local", "dask"):
        job = _job(
            work / f"train_{engine}.toml",
            train.format(data=data, engine=engine, out=work / "runs"),
        )
        wall, run = _run(job)
        ev = _events(run)
        startup = ev["engine_started"]["seconds"] if "engine_started" in ev else 0.0
        t = time.perf_counter()
        if engine == "local":
            m = NeymanPearsonSGD(rho=0.05, epochs=3, random_state=0).fit(ds)
            direct = time.perf_counter() - t
        else:
            with DaskEngine(n_workers=2, dashboard=False) as eng:
                t = time.perf_counter()
                m = fit_distributed(
                    NeymanPearsonSGD(rho=0.05, epochs=3, random_state=0),
                    ds,
                    eng,
                    progress=False,
                )
                direct = time.perf_counter() - t
        metrics = json.loads((run / "metrics.json").read_text())
        fit_in_job = metrics["fit_seconds"]
        from bigrate.metrics import evaluate_split

        direct_test = evaluate_split(m.decision_function, ds, "test", rho=0.05)
        res[f"train_{engine}"] = {
            "bigrate_run_wall_s": wall,
            "engine_startup_s": startup,
            "fit_in_job_s": fit_in_job,
            "direct_fit_s": direct,
            "job_minus_startup_over_direct": (wall - startup) / direct,
            "fit_in_job_over_direct": fit_in_job / direct,
            "test_pfa_pnd_job": [
                metrics["evaluation"]["test"][k] for k in ("pfa", "pnd")
            ],
            "test_pfa_pnd_direct": [direct_test[k] for k in ("pfa", "pnd")],
            "note": "the job also evaluates every split and saves the model; wall time "
            "includes interpreter start-up and imports",
        }
        print(engine, res[f"train_{engine}"], flush=True)


def _sweeps(
    out: Path,
    work: Path,
    res: dict,
    repeats: int = 3,
    n_alpha: int = 6,
    epoch_list=(5, 10, 40),
) -> None:
    from datetime import datetime

    from bigrate.data.prep import run_recipe

    # 6 alphas: 1e-6 .. 1e-1 (12 points x 3 folds = 36 tasks); more: a longer sweep
    alphas = json.dumps([float(a) for a in np.logspace(-6, -1, n_alpha)])
    n_tasks = 2 * n_alpha * 3
    a9a = work / "a9a"
    if not (a9a / "manifest.json").exists():
        run_recipe("a9a", a9a, progress=False)
    sweep = """
[job]
kind = "sweep"
name = "bench-sweep"
[data]
path = "{data}"
[model]
estimator = "NeymanPearsonSGD"
params = {{ rho = 0.05, epochs = {epochs} }}
[sweep]
grid = {{ alpha = {alphas}, loss = ["sigmoid", "ramp"] }}
cv = 3
batch_seconds = {batch}
[engine]
name = "{engine}"
workers = 2
[output]
dir = "{out}"
"""
    configs = [(engine, batch) for engine, batch in
               (("local", 0), ("dask", 1), ("dask", 0), ("ray", 1), ("ray", 0))]  # fmt: skip
    runs: dict = {}
    # every configuration `repeats` times, interleaved (this machine is shared: the
    # median of the repeats, not one run, is reported)
    for rep in range(repeats):
        for epochs in epoch_list:
            for engine, batch in configs:
                key = f"sweep_{engine}_epochs{epochs}" + (
                    "_unbatched" if engine != "local" and batch == 0 else ""
                )
                body = sweep.format(data=a9a, engine=engine, out=work / "runs",
                                    epochs=epochs, batch=batch, alphas=alphas)  # fmt: skip
                wall, run = _run(_job(work / f"{key}.toml", body))
                ev = _events(run)
                t0 = ev["sweep_started"]["time"]
                t1 = ev["sweep_selected"]["time"]
                span = (
                    datetime.fromisoformat(t1) - datetime.fromisoformat(t0)
                ).total_seconds()
                if "sweep_batches" in ev:
                    batches = ev["sweep_batches"]["sizes"]
                else:  # one fit a task, or a run of the code before guided batches
                    batches = [
                        json.loads(line).get("batch")
                        for line in (run / "events.jsonl").read_text().splitlines()
                        if '"sweep_wave"' in line
                    ]
                task_s = [
                    json.loads(p.read_text())["seconds"]
                    for p in (run / "results").glob("*.json")
                ]
                one = {
                    "median_task_s": float(sorted(task_s)[len(task_s) // 2]),
                    "sweep_s": span,
                    "engine_startup_s": ev["engine_started"]["seconds"],
                    "worker_warm_up_s": ev.get("engine_warm", {}).get("seconds"),
                    # before the change the sweep read its data in its first task
                    "data_load_s": ev.get("data_loaded", {}).get("seconds", 0.0),
                    "bigrate_run_wall_s": wall,
                    "batches": batches,
                }
                runs.setdefault((epochs, key), []).append(one)
                print(rep, key, one, flush=True)
    for (epochs, key), reps in runs.items():
        med = float(np.median([r["sweep_s"] for r in reps]))
        res[key] = {
            "tasks": n_tasks,
            "epochs": epochs,
            "repeats": len(reps),
            "sweep_s_each": [r["sweep_s"] for r in reps],
            "sweep_s": med,
            "tasks_per_s": n_tasks / med,
            # the sweep with the driver's reading and putting of the data in it
            "tasks_per_s_with_data_load": n_tasks
            / float(np.median([r["sweep_s"] + r["data_load_s"] for r in reps])),
            **{
                k: float(np.median([r[k] for r in reps]))
                for k in (
                    "median_task_s",
                    "engine_startup_s",
                    "worker_warm_up_s",
                    "data_load_s",
                    "bigrate_run_wall_s",
                )
            },  # fmt: skip
            "batches": reps[-1]["batches"],
        }
    for epochs in epoch_list:
        local = res[f"sweep_local_epochs{epochs}"]
        for k, v in res.items():
            if k.startswith("sweep_") and v["epochs"] == epochs:
                v["throughput_vs_local"] = v["tasks_per_s"] / local["tasks_per_s"]
                v["throughput_vs_local_with_data_load"] = (
                    v["tasks_per_s_with_data_load"]
                    / local["tasks_per_s_with_data_load"]
                )


if __name__ == "__main__":
    main()
