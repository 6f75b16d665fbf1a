"""Synthetic pin files, spectra kept through prep, and q-values after target-decoy
competition from `bigrate predict --q` (issue 48, item 3)."""

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from bigrate.data import ShardedDataset
from bigrate.data.prep import find_shared_data, prep_pin
from bigrate.data.prep.synth_pin import pin_model, write_synthetic_pin
from bigrate.metrics import best_per_group
from tests.conftest import run_cli

SOURCE = find_shared_data() / "psm_pin_mokapot_10k" / "10k_psms_test.pin.gz"


def read_pin(path):
    return pacsv.read_csv(str(path), parse_options=pacsv.ParseOptions(delimiter="\t"))


@pytest.fixture(scope="module")
def model():
    return pin_model()


def test_a_synthetic_pin_file_has_the_shared_files_layout_and_spectra(tmp_path, model):
    r = write_synthetic_pin(tmp_path / "s.pin", 6000, seed=3, model=model,
                            progress=False)  # fmt: skip
    src, t = read_pin(SOURCE), read_pin(tmp_path / "s.pin")
    assert t.column_names == src.column_names  # header unquoted, same order
    assert (tmp_path / "s.pin").read_text().startswith("SpecId\tLabel\tScanNr\t")
    assert r["psms"] == t.num_rows and 6000 <= r["psms"] < 6000 + 20
    y = t.column("Label").to_numpy()
    assert set(np.unique(y)) == {-1, 1} and r["targets"] == int((y > 0).sum())
    scan = t.column("ScanNr").to_numpy()
    assert np.all(np.diff(scan) >= 0) and r["spectra"] == len(np.unique(scan))
    mass = t.column("ExpMass").to_numpy()
    for s in np.unique(scan)[:200]:  # one precursor mass a spectrum
        assert len(np.unique(mass[scan == s])) == 1
    # PSMs per spectrum and the target share follow the shared file's
    _, k = np.unique(scan, return_counts=True)
    _, k_src = np.unique(src.column("ScanNr").to_numpy(), return_counts=True)
    assert abs(k.mean() - k_src.mean()) < 0.1
    y_src = src.column("Label").to_numpy()
    assert abs((y > 0).mean() - (y_src > 0).mean()) < 0.03
    # discrete features stay on the shared file's values
    for c in ("missedCleavages", "MS8_feature_5"):
        assert set(np.unique(t.column(c).to_numpy())) <= set(
            np.unique(src.column(c).to_numpy())
        )


def test_synthetic_files_are_seeded_and_a_smaller_one_is_a_prefix(tmp_path, model):
    kw = {"model": model, "progress": False, "block_psms": 1000}
    a = write_synthetic_pin(tmp_path / "a.pin", 2500, seed=1, **kw)
    b = write_synthetic_pin(tmp_path / "b.pin.gz", 4000, seed=1, **kw)
    write_synthetic_pin(tmp_path / "c.pin", 2500, seed=2, **kw)
    ta, tb, tc = (read_pin(tmp_path / f) for f in ("a.pin", "b.pin.gz", "c.pin"))
    assert tb.slice(0, a["psms"]).equals(ta)
    assert b["psms"] > a["psms"] and not tc.equals(ta)
    with pytest.raises(ValueError, match="psms must be at least 1"):
        write_synthetic_pin(tmp_path / "d.pin", 0, **kw)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pin", "b.pin.gz", "c.pin"]


def test_correct_matches_are_what_a_model_finds(tmp_path, model):
    """Targets drawn as correct matches score above the decoys: trained on one file, a
    q-value model accepts most of the correct spectra of another at q = 0.01."""
    from bigrate.linear import QValueSGD
    from bigrate.metrics import positives_at_q

    write_synthetic_pin(tmp_path / "tr.pin", 20000, seed=1, model=model,
                        progress=False)  # fmt: skip
    write_synthetic_pin(tmp_path / "te.pin", 20000, seed=2, model=model,
                        progress=False)  # fmt: skip
    prep_pin(tmp_path / "tr.pin", tmp_path / "tr", split="train=1", standardize=True,
             progress=False)  # fmt: skip
    tr = ShardedDataset(tmp_path / "tr").to_csr("train")
    clf = QValueSGD(q=0.01, random_state=0).fit(tr.X, tr.y)
    te = read_pin(tmp_path / "te.pin")
    feats = [c for c in te.column_names if c.startswith(("MS8", "missed"))]
    X = np.column_stack([te.column(c).to_numpy().astype(float) for c in feats])
    std = ShardedDataset(tmp_path / "tr").standardizer
    y = te.column("Label").to_numpy()
    f = clf.decision_function(std.apply(sp.csr_matrix(X)))
    keep = best_per_group(f, te.column("ScanNr").to_numpy())
    accepted = positives_at_q(y[keep], f[keep], 0.01, plus_one=True)
    n_spectra = keep.sum()
    expected_correct = model.correct_spectra * n_spectra
    assert 0.6 * expected_correct < accepted < 1.1 * expected_correct


def brute_force_accepted(y, f, groups, q):
    """Best row of each group by a plain loop, then the largest prefix of the
    descending scores whose (decoys + 1) / targets is <= q; the targets in it."""
    best = {}
    for i, g in enumerate(groups):
        if g not in best or f[i] > f[best[g]]:
            best[g] = i
    rows = sorted(best.values(), key=lambda i: -f[i])
    accepted, t, d = 0, 0, 0
    for i in rows:
        t += y[i] > 0
        d += y[i] < 0
        if t and (d + 1) / t <= q:
            accepted = t
    return accepted


def test_prep_keeps_spectra_and_predict_counts_after_competition(tmp_path, model):
    write_synthetic_pin(tmp_path / "tr.pin", 30000, seed=1, model=model,
                        progress=False)  # fmt: skip
    write_synthetic_pin(tmp_path / "ev.pin", 8000, seed=2, model=model,
                        progress=False)  # fmt: skip
    run_cli("prep", "pin", tmp_path / "tr.pin", "--out", tmp_path / "tr", "--split",
            "train=1", "--standardize", "--quiet", check=True)  # fmt: skip
    assert not ShardedDataset(tmp_path / "tr").has_group
    run_cli("prep", "pin", tmp_path / "ev.pin", "--out", tmp_path / "ev", "--split",
            "train=1", "--spectra", "--quiet", check=True)  # fmt: skip
    ev = ShardedDataset(tmp_path / "ev")
    assert ev.has_group
    assert "ScanNr" not in ev.manifest["preprocessing"]["feature_columns"]
    run_cli("train", tmp_path / "tr", "--estimator", "QValueSGD", "--q", "0.01",
            "--out", tmp_path / "run", "--quiet", check=True)  # fmt: skip
    p = run_cli("predict", tmp_path / "run", tmp_path / "ev", "--out",
                tmp_path / "p.parquet", "--q", "0.01", check=True)  # fmt: skip
    t = pq.read_table(tmp_path / "p.parquet")
    assert t.num_rows == ev.n_rows("train") >= 8000
    src = read_pin(tmp_path / "ev.pin")
    scan = src.column("ScanNr").to_numpy()
    row = t.column("row_id").to_numpy()
    assert np.array_equal(t.column("group").to_numpy(zero_copy_only=False).astype(int),
                          scan[row])  # fmt: skip
    y, f = t.column("label").to_numpy(), t.column("score").to_numpy()
    want = brute_force_accepted(y, f, scan[row], 0.01)
    assert want > 100
    assert f"accepted at q = 0.01: {want:,} targets among the best PSMs of " in p.stdout


def test_best_per_group_against_a_loop():
    rng = np.random.default_rng(0)
    f = rng.normal(size=500).round(1)  # ties
    g = rng.integers(0, 60, size=500)
    keep = best_per_group(f, g)
    for grp in np.unique(g):
        rows = np.flatnonzero(g == grp)
        best = rows[np.argmax(f[rows])]  # first of the ties
        assert keep[rows].sum() == 1 and keep[best]
    names = np.array([f"s{x}" for x in g])
    assert np.array_equal(best_per_group(f, names), keep)
    with pytest.raises(ValueError, match="NaN"):
        best_per_group(np.r_[f[:-1], np.nan], g)
    with pytest.raises(ValueError, match="same length"):
        best_per_group(f, g[:-1])
