"""`bigrate status`: what a run directory holds and where it stands."""

from __future__ import annotations

from bigrate.rundir import RunDir, find_runs, resolve_latest, run_state


def results_table(evaluation: dict, target: dict | None = None) -> str:
    """The one results table of `bigrate train`, `run`, `resume` and `status`: per
    split the counts, Pfa, Pnd and the selection metric, and a flag on every split
    whose false-alarm rate is above a target rho, or whose estimated false discovery
    rate (decoys / targets accepted at f >= 0) is above a target q."""
    if not evaluation:
        return "(no evaluation)"
    target = target or {}
    first = next(iter(evaluation.values()))
    keys = [k for k in ("pfa", "pnd", "error_rate", "auc", "J_val", "accepted", "fdr",
                        "cost") if k in first]  # fmt: skip
    rho = target.get("rho")
    q = target.get("q") if "fdr" in first else None
    head = f"{'split':<8}{'n+':>8}{'n-':>8}" + "".join(f"{k:>12}" for k in keys)
    if rho is not None:
        head += f"   Pfa <= rho = {rho:g}?"
    if q is not None:
        head += f"   FDR <= q = {q:g}?"
    lines = [head]
    for split, row in evaluation.items():
        line = (
            f"{split:<8}{row.get('n_pos', ''):>8}{row.get('n_neg', ''):>8}"
            + "".join(
                f"{row[k]:>12.4f}" if isinstance(row[k], float) else f"{row[k]:>12}"
                for k in keys
            )
        )
        if rho is not None:
            over = row["pfa"] - rho
            line += "   yes" if over <= 0 else f"   NO: {over:+.4f} above rho"
        if q is not None:
            over = row["fdr"] - q
            line += "   yes" if over <= 0 else f"   NO: {over:+.4f} above q"
        lines.append(line)
    if rho is not None and any(r["pfa"] > rho for r in evaluation.values()):
        lines.append(
            "note: Pfa above rho on a split; for a guarantee on new data calibrate on "
            "held-out negatives (calibrate='umbrella')"
        )
    if q is not None and any(r["fdr"] > q for r in evaluation.values()):
        lines.append(
            "note: the accepted set's estimated FDR is above q on a split; count the "
            "accepted at q ('accepted', which sets its own threshold) rather than f >= 0"
        )
    return "\n".join(lines)


def sweep_table(sweep: dict, top: int = 10) -> str:
    """The per-point sweep summary (as scikit-learn's cv_results_): rank, parameters,
    mean and spread over the folds of the selection metric, Pfa and Pnd."""
    sel = sweep["select"]
    rows = sorted(
        (r for r in sweep["points"] if r.get("rank") is not None),
        key=lambda r: r["rank"],
    )
    lines = [
        f"{'rank':>4}  {'mean ' + sel:>12}{'std':>9}{'Pfa':>9}{'Pnd':>9}{'folds':>7}  "
        "params"
    ]
    for r in rows[:top]:
        lines.append(
            f"{r['rank']:>4}  {r['mean_' + sel]:>12.4g}{r.get('std_' + sel, 0):>9.3g}"
            f"{r.get('mean_pfa', float('nan')):>9.4f}"
            f"{r.get('mean_pnd', float('nan')):>9.4f}{r['n_ok']:>7}  {r['params']}"
        )
    if len(rows) > top:
        lines.append(f"      ... {len(rows) - top} more in summary.parquet")
    return "\n".join(lines)


def constraints_table(rows: list[dict]) -> str:
    """Each constraint of a job on each split: the value its left side takes, its
    target (the right side's value) and whether it holds."""
    if not rows:
        return ""
    width = max(len("constraint"), *(len(r["constraint"]) for r in rows))
    lines = [f"{'constraint':<{width}}  {'split':<6}{'value':>10}{'target':>10}   met"]
    for r in rows:
        for split, v in r.items():
            if not isinstance(v, dict):
                continue
            met = "yes" if v["met"] else f"NO: {v['value'] - v['target']:+.4f}"
            lines.append(
                f"{r['constraint']:<{width}}  {split:<6}{v['value']:>10.4f}"
                f"{v['target']:>10.4f}   {met}"
            )
    return "\n".join(lines)


def format_metrics(metrics: dict) -> str:
    lines = [results_table(metrics.get("evaluation", {}), metrics.get("target"))]
    if metrics.get("guarantee"):
        lines.append(f"guarantee: {metrics['guarantee']['text']}")
    if metrics.get("constraints"):
        lines.append(constraints_table(metrics["constraints"]))
    if metrics.get("bpsp"):
        b = metrics["bpsp"]
        p = b["best_params"]
        lines.append(
            f"BPSP: exact CV error {b['cv_error']:.4g} (cost_fn "
            f"{b['cost_fn']:g}, cost_fp {b['cost_fp']:g}) at C+ = {p['C_pos']:.4g}, "
            f"C- = {p['C_neg']:.4g}, gamma = {p['gamma']:.4g} (region area "
            f"{b['best_region_area']:.3g})"
        )
    if metrics.get("tau"):
        t = metrics["tau"]
        lines.append(
            f"quantile path: tau = {t['tau_chosen']:.4g} chosen on the {t['split']} "
            f"split ({t['by']}, rho {t['rho']:g})"
        )
    cf = metrics.get("crossfit")
    if cf:
        lines.append(
            f"crossfit: {cf['folds']} folds over {', '.join(cf['splits'])} "
            f"({cf['rows']:,} rows{', grouped' if cf['grouped'] else ''}; scale "
            f"{cf['scale']}): each row scored by the fold model that did not see it, "
            "in scores.parquet"
        )
        acc = cf.get("accepted_competed")
        if acc:
            among = "the best row of each group" if acc["competed"] else "all rows"
            lines.append(
                f"crossfit: {acc['accepted']:,} positives accepted at q = {acc['q']:g} "
                f"((negatives + 1) / positives, among {among})"
            )
    sw = metrics.get("sweep")
    if sw:
        if any("rank" in r for r in sw["points"]):
            lines.append(sweep_table(sw))
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
    if job["kind"] == "crossfit":
        res = run.results()
        lines.append(f"crossfit {len(res)}/{job['folds']} folds done")
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
