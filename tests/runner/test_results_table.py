"""The one results table of train / run / status: a flag on every split whose
false-alarm rate is above rho."""

from bigrate.runner.status import results_table, sweep_table


def test_every_split_above_rho_is_flagged():
    ev = {
        "train": {"pfa": 0.010, "pnd": 0.2, "n_pos": 90, "n_neg": 100, "J_val": 0.2},
        "test": {"pfa": 0.062, "pnd": 0.25, "n_pos": 90, "n_neg": 100, "J_val": 0.49},
    }
    lines = results_table(ev, {"rho": 0.05}).splitlines()
    assert "Pfa <= rho = 0.05?" in lines[0]
    assert lines[1].startswith("train") and lines[1].endswith("yes")
    assert lines[2].startswith("test") and lines[2].endswith("NO: +0.0120 above rho")
    assert "calibrate='umbrella'" in lines[3]
    assert "Pfa <= rho" not in results_table(ev, {"q": 0.01})  # no rho, no flag


def test_sweep_table_is_ranked():
    sweep = {
        "select": "J_val",
        "points": [
            {"point": 0, "params": {"a": 1}, "rank": 2, "mean_J_val": 0.5,
             "std_J_val": 0.1, "mean_pfa": 0.05, "mean_pnd": 0.4, "n_ok": 3},
            {"point": 1, "params": {"a": 2}, "rank": 1, "mean_J_val": 0.3,
             "std_J_val": 0.05, "mean_pfa": 0.04, "mean_pnd": 0.3, "n_ok": 3},
            {"point": 2, "params": {"a": 3}, "mean_J_val": 0.1, "n_ok": 1},
        ],
    }  # fmt: skip
    lines = sweep_table(sweep).splitlines()
    assert "mean J_val" in lines[0]
    assert lines[1].split()[0] == "1" and "{'a': 2}" in lines[1]
    assert lines[2].split()[0] == "2" and len(lines) == 3  # unranked point left out


def test_q_value_runs_flag_an_accepted_set_above_q():
    import numpy as np

    from bigrate.metrics import rate_metrics

    y = np.r_[np.ones(50), -np.ones(50)]
    f = np.r_[np.linspace(-1, 1, 50), np.linspace(-3, 0.5, 50)]
    m = rate_metrics(y, f, q=0.05)
    # accepted at f >= 0: the targets and decoys with a non-negative score
    fd, tp = int((f[y < 0] >= 0).sum()), int((f[y > 0] >= 0).sum())
    assert m["fdr"] == fd / tp and m["fdr"] > 0.05
    ok = dict(m, fdr=0.0)
    lines = results_table({"train": ok, "test": m}, {"q": 0.05}).splitlines()
    assert "FDR <= q = 0.05?" in lines[0] and lines[1].endswith("yes")
    assert lines[2].endswith(f"NO: {m['fdr'] - 0.05:+.4f} above q")
    assert "FDR" not in results_table({"test": m}, {"rho": 0.1})
