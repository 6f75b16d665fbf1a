"""`bigrate status`: what a run directory holds and where it stands."""

from __future__ import annotations

from bigrate.rundir import RunDir, find_runs, resolve_latest, run_state


def format_metrics(metrics: dict) -> str:
    ev = metrics.get("evaluation", {})
    if not ev:
        return "(no evaluation)"
    keys = [
        k for k in ("pfa", "pnd", "J_val", "accepted") if k in next(iter(ev.values()))
    ]
    lines = [f"{'split':<8}" + "".join(f"{k:>10}" for k in keys)]
    for split, row in ev.items():
        lines.append(
            f"{split:<8}"
            + "".join(
                f"{row[k]:>10.4f}" if isinstance(row[k], float) else f"{row[k]:>10}"
                for k in keys
            )
        )
    sw = metrics.get("sweep")
    if sw:
        b = sw["best"]
        lines.append(
            f"sweep: best point {b['point']} {b['params']} ({sw['select']} "
            f"{b['mean_' + sw['select']]:.4g}); {len(sw['points'])} points, "
            f"{sw['failed_tasks']} failed task(s)"
        )
    return "\n".join(lines)


def status_text(path) -> str:
    run = RunDir.open(resolve_latest(path))
    job = run.read_json("config.json")["job"]
    events = run.events()
    state, detail = run_state(run)
    if detail:
        state = f"{state}: {detail}"
    lines = [
        f"run      {run.path}",
        f"job      {job['name']} ({job['kind']}, "
        f"{job.get('estimator')}, engine {job['engine']}"
        + (f" at {job['address']}" if job.get("address") else "")
        + ")",
        f"state    {state}",
    ]
    if job["kind"] == "sweep":
        import itertools

        n_points = len(list(itertools.product(*job["grid"].values())))
        n_folds = 1 if job["cv"] == "val" else int(job["cv"])
        res = run.results()
        failed = sum(1 for r in res.values() if r["status"] != "ok")
        lines.append(
            f"sweep    {len(res)}/{n_points * n_folds} tasks done "
            f"({n_points} points x {n_folds} folds), {failed} failed"
        )
    if events:
        lines.append(
            f"events   {len(events)}, last: {events[-1]['event']} at "
            f"{events[-1]['time']}"
        )
    if (run.path / "metrics.json").exists():
        lines.append(format_metrics(run.read_json("metrics.json")))
    return "\n".join(lines)


def runs_text(parent="runs") -> str:
    """One line per run directory under ``parent``: name, kind, state, last event."""
    runs = find_runs(parent)
    if not runs:
        return f"no run directories under {parent}"
    lines = [f"{'run':<40}{'kind':<10}{'state':<13}last event"]
    for run in runs:
        try:
            job = run.read_json("config.json").get("job", {})
        except (OSError, ValueError):
            job = {}
        state, _ = run_state(run)
        ev = run.events()
        last = f"{ev[-1]['event']} {ev[-1]['time'][:19]}" if ev else ""
        lines.append(f"{run.path.name:<40}{job.get('kind', '?'):<10}{state:<13}{last}")
    return "\n".join(lines)
