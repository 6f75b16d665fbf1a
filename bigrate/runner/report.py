"""`bigrate report`: PNG plots and one self-contained HTML page for a run directory.

* ROC curve of the model on the test split (val, else train, when there is no test split)
  with the NP operating point (threshold 0) and the rho line; for a crossfit run, of the
  cross-fitted scores of every row (and for a q-value learner the positives accepted at
  each q-value);
* Pfa, Pnd and the multiplier lambda per epoch;
* for sweeps, the selection score over the grid (a heat map for two parameters, a line
  for one, a bar per point otherwise);
* for a quantile path, Pfa and Pnd on the held-out split along tau, with the chosen tau;
* for BPSP, the exact CV-error map with the chosen (C+, C-) (written by the run);
* for a job's dataset constraints, each one's two sides on every split.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import numpy as np

from bigrate._plot import pyplot, save_png
from bigrate.data.reader import ShardedDataset
from bigrate.metrics import roc_points
from bigrate.rundir import RunDir
from bigrate.runner.modelio import TrainedModel
from bigrate.runner.status import format_metrics, sweep_table

plt = pyplot()


def plot_roc(
    score, ds: ShardedDataset, split: str, target: tuple[str, float] | None, path: Path
) -> Path:
    """``score`` maps a block of rows of ``ds`` to the model's scores."""
    ys, fs = [], []
    for b in ds.iter_batches(split):
        ys.append(b.y)
        fs.append(score(b.X))
    y, f = np.concatenate(ys), np.concatenate(fs)
    return plot_roc_of(y, f, target, f"ROC on the {split} split", path)


def plot_roc_of(y, f, target: tuple[str, float] | None, title: str, path: Path) -> Path:
    """The ROC curve of scores ``f`` on labels ``y`` (+1 / -1), the operating point
    (f >= 0) marked and, for an NP target, the rho line."""
    fpr, tpr, _ = roc_points(y, f)
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    ax.plot(fpr, tpr, lw=1.6, label="ROC")
    pfa = float(np.mean(f[y < 0] >= 0))
    det = float(np.mean(f[y > 0] >= 0))
    ax.plot([pfa], [det], "o", color="C3", label=f"operating point (Pfa {pfa:.3f})")
    if target and target[0] == "rho":
        ax.axvline(target[1], color="C2", ls="--", label=f"rho = {target[1]:g}")
    ax.set_xlabel("false-alarm rate (Pfa)")
    ax.set_ylabel("detection rate (1 - Pnd)")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def plot_accepted(y, f, q: float, path: Path) -> Path:
    """Positives (targets) accepted at every q-value up to 10% (and up to 2 q), from
    the q-values of scores ``f`` on labels ``y``, with the target q marked."""
    from bigrate.metrics import qvalues

    qv = np.sort(qvalues(y, f)[np.asarray(y) > 0])
    grid = np.linspace(0.0, max(0.1, 2 * q), 201)
    fig, ax = plt.subplots(figsize=(5.2, 4.4))
    ax.plot(grid, np.searchsorted(qv, grid, side="right"), lw=1.6)
    at = int(np.searchsorted(qv, q, side="right"))
    ax.axvline(q, color="C2", ls="--", label=f"q = {q:g}: {at:,} accepted")
    ax.set_xlabel("q-value threshold")
    ax.set_ylabel("positives (targets) accepted")
    ax.set_title("Accepted at each q-value")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def plot_history(
    history: list[dict], target: tuple[str, float] | None, path: Path
) -> Path | None:
    if not history:
        return None
    step = "epoch" if "epoch" in history[0] else "iteration"  # SGD epochs, DC steps
    if step not in history[0] or "lambda" not in history[0]:
        return None
    ep = [h[step] for h in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    how = "progressive" if step == "epoch" else "after the step"
    a1.plot(ep, [h["pfa"] for h in history], "o-", label=f"Pfa (training, {how})")
    a1.plot(ep, [h["pnd"] for h in history], "s-", label=f"Pnd (training, {how})")
    if target:
        a1.axhline(target[1], color="C2", ls="--", label=f"{target[0]} = {target[1]:g}")
    a1.set_xlabel(step)
    a1.set_ylabel("training rate")
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    lam = [h["lambda"] for h in history]
    a2.plot(ep, lam, "o-", color="C4")
    a2.set_xlabel(step)
    a2.set_ylabel("Lagrange multiplier lambda")
    if max(lam) / max(min(lam), 1e-300) > 20:  # a log scale only where it helps
        a2.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter

    a2.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    a2.yaxis.set_minor_formatter(FormatStrFormatter(""))
    a2.grid(alpha=0.3)
    return save_png(fig, path)


def _lab(v) -> str:
    return (
        f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    )


def _numeric(vals) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def plot_sweep(sweep: dict, path: Path) -> Path | None:
    sel = sweep["select"]
    col = f"mean_{sel}"  # the per-point summary's column (mean over the folds)
    rows = [r for r in sweep["points"] if col in r]
    if not rows:
        return None
    keys = sorted(rows[0]["params"])
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    if len(keys) == 2:
        xs = sorted(
            {r["params"][keys[0]] for r in rows},
            key=str if not _numeric([r["params"][keys[0]] for r in rows]) else None,
        )
        ys = sorted(
            {r["params"][keys[1]] for r in rows},
            key=str if not _numeric([r["params"][keys[1]] for r in rows]) else None,
        )
        grid = np.full((len(ys), len(xs)), np.nan)
        for r in rows:
            grid[ys.index(r["params"][keys[1]]), xs.index(r["params"][keys[0]])] = r[
                col
            ]
        im = ax.imshow(
            grid,
            origin="lower",
            aspect="auto",
            cmap="viridis_r" if sel != "accepted" else "viridis",
        )
        ax.set_xticks(range(len(xs)), [_lab(v) for v in xs], rotation=45)
        ax.set_yticks(range(len(ys)), [_lab(v) for v in ys])
        ax.set_xlabel(keys[0])
        ax.set_ylabel(keys[1])
        for yi in range(len(ys)):
            for xi in range(len(xs)):
                if np.isfinite(grid[yi, xi]):
                    r, g, b_, _ = im.cmap(im.norm(grid[yi, xi]))
                    dark = 0.299 * r + 0.587 * g + 0.114 * b_ < 0.5
                    ax.text(xi, yi, f"{grid[yi, xi]:.3g}", ha="center", va="center",
                            fontsize=8, color="white" if dark else "black")  # fmt: skip
        b = sweep["best"]["params"]
        bx, by = xs.index(b[keys[0]]), ys.index(b[keys[1]])
        ax.add_patch(plt.Rectangle((bx - 0.5, by - 0.5), 1, 1, fill=False, ec="red",
                                   lw=2.5, label="best"))  # fmt: skip
        ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
        fig.colorbar(im, ax=ax, label=f"mean {sel} over the folds")
    elif len(keys) == 1:
        vals = [r["params"][keys[0]] for r in rows]
        if _numeric(vals):
            rs = sorted(rows, key=lambda r: r["params"][keys[0]])
            ax.plot([r["params"][keys[0]] for r in rs], [r[col] for r in rs], "o-")
            if all(v > 0 for v in vals):
                ax.set_xscale("log")
        else:
            ax.bar([_lab(v) for v in vals], [r[col] for r in rows])
        ax.set_xlabel(keys[0])
        ax.set_ylabel(f"mean {sel} over the folds")
    else:
        ax.bar(range(len(rows)), [r[col] for r in rows])
        ax.set_xlabel("grid point")
        ax.set_ylabel(f"mean {sel} over the folds")
    b = sweep["best"]
    ax.set_title(
        f"sweep: {sel} per point (best {b[col]:.4g} at {b['params']})", fontsize=8
    )
    return save_png(fig, path)


def plot_tau_path(tau: dict, path: Path) -> Path:
    """Pfa and Pnd along tau on the split the quantile path's tau was chosen on."""
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    ax.plot(tau["tau"], tau["pfa"], label="Pfa")
    ax.plot(tau["tau"], tau["pnd"], label="Pnd")
    ax.axhline(tau["rho"], color="C2", ls="--", label=f"rho = {tau['rho']:g}")
    ax.axvline(tau["tau_chosen"], color="C3", ls=":",
               label=f"chosen tau = {tau['tau_chosen']:.3g}")  # fmt: skip
    ax.set_xlabel("tau (share of the cost on false positives)")
    ax.set_ylabel(f"rate on the {tau['split']} split")
    ax.set_title(f"quantile path: tau chosen by {tau['by']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def make_report(run_path) -> Path:
    """Write report/*.png and report/index.html (images embedded); returns the page."""
    run = RunDir.open(run_path)
    job = run.read_json("config.json")["job"]
    out = run.path / "report"
    out.mkdir(exist_ok=True)
    metrics = (
        run.read_json("metrics.json") if (run.path / "metrics.json").exists() else {}
    )
    pngs: list[tuple[str, Path]] = []
    model_dir = (
        run.path / "model"
        if (run.path / "model").exists()
        else (Path(job["model"]) if job.get("model") else None)
    )
    target = None
    if model_dir is not None and (model_dir / "model.json").exists():
        model = TrainedModel(model_dir)
        est = model.estimator
        target = next(iter(est.rate_target().items()), None)  # what it promises
        ds = ShardedDataset(job["data"], storage_options=job.get("storage_options"))
        split = next(s for s in ("test", "val", "train") if s in ds.splits)
        pngs.append(
            (
                "ROC curve with the NP operating point",
                plot_roc(model.scorer(ds), ds, split, target, out / "roc.png"),
            )
        )
        h = plot_history(getattr(est, "history_", []), target, out / "history.png")
        if h:
            pngs.append(("Training Pfa, Pnd and the multiplier lambda", h))
    if metrics.get("crossfit") and (run.path / "scores.parquet").exists():
        import pyarrow.parquet as pq

        t = pq.read_table(run.path / "scores.parquet", columns=["label", "score"])
        target = next(iter(metrics.get("target", {}).items()), None)
        pngs.append(
            (
                "ROC of every row, each scored by the fold model that did not see it",
                plot_roc_of(
                    t.column("label").to_numpy(), t.column("score").to_numpy(),
                    target, "ROC of the cross-fitted scores (all rows)",
                    out / "roc.png",
                ),
            )
        )  # fmt: skip
        if target and target[0] == "q":
            pngs.append(
                (
                    "Targets accepted at each q-value, every row cross-fitted",
                    plot_accepted(
                        t.column("label").to_numpy(), t.column("score").to_numpy(),
                        target[1], out / "accepted.png",
                    ),
                )
            )  # fmt: skip
    if metrics.get("sweep"):
        s = plot_sweep(metrics["sweep"], out / "sweep.png")
        if s:
            pngs.append(("Sweep score over the grid", s))
    if metrics.get("tau"):
        pngs.append(("Quantile path: held-out Pfa and Pnd along tau",
                     plot_tau_path(metrics["tau"], out / "tau_path.png")))  # fmt: skip
    if (run.path / "bpsp_cv_error.png").exists():
        pngs.append(("BPSP: the exact CV-error map, the chosen point starred",
                     run.path / "bpsp_cv_error.png"))  # fmt: skip
    parts = [
        f"<h1>bigrate run {html.escape(run.path.name)}</h1>",
        f"<p>job <b>{html.escape(job['name'])}</b> ({job['kind']}, "
        f"{html.escape(str(job.get('estimator')))}, engine {job['engine']})</p>",
        "<pre>" + html.escape(format_metrics(metrics)) + "</pre>",
    ]
    if metrics.get("sweep") and any("rank" in r for r in metrics["sweep"]["points"]):
        parts.append(
            "<h2>Sweep: every point, ranked (mean and spread over the folds)</h2><pre>"
            + html.escape(sweep_table(metrics["sweep"], top=1000))
            + "</pre>"
        )
    for title, p in pngs:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        parts.append(
            f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' "
            f"src='data:image/png;base64,{data}'>"
        )
    parts.append(
        "<h2>Configuration</h2><pre>"
        + html.escape(json.dumps(job, indent=2))
        + "</pre>"
    )
    page = out / "index.html"
    tmp = out / ".index.html.tmp"
    tmp.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>bigrate "
        "report</title></head><body style='font-family:sans-serif'>"
        + "\n".join(parts)
        + "</body></html>\n",
        encoding="utf-8",
    )
    tmp.replace(page)
    return page
