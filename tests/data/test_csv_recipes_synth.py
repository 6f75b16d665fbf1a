"""Dense CSV, pin files, the shared-data recipes and the synthetic generator."""

import gzip
import json

import numpy as np
import pytest

from bigrate.data import ShardedDataset
from bigrate.data.prep import RECIPES, prep_csv, prep_synth, run_recipe
from tests.conftest import run_cli


def test_csv_dense_round_trip_with_groups(tmp_path, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((500, 6)).round(5)
    X[rng.random(X.shape) < 0.3] = 0.0
    y = np.where(rng.random(500) < 0.3, "bad", "good")
    g = np.where(rng.random(500) < 0.5, "F", "M")
    lines = ["f0,f1,id,f2,f3,f4,f5,sex,y"]
    for i in range(500):
        f = [f"{v:.5f}" for v in X[i]]
        lines.append(",".join(f[:2] + [str(1000 + i)] + f[2:] + [g[i], y[i]]))
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    man = prep_csv(
        tmp_path / "d.csv",
        tmp_path / "ds",
        label_column="y",
        group_column="sex",
        drop_columns=["id"],
        positive_labels=["good"],
        negative_labels=["bad"],
        split="train=1",
        progress=False,
        seed=seed,
    )
    ds = ShardedDataset(tmp_path / "ds")
    got = ds.to_csr("train")
    np.testing.assert_array_equal(got.X.toarray(), X.astype(np.float32))
    np.testing.assert_array_equal(got.y, np.where(y == "good", 1, -1))
    np.testing.assert_array_equal(got.group, g)
    assert man["preprocessing"]["feature_columns"] == [
        "f0",
        "f1",
        "f2",
        "f3",
        "f4",
        "f5",
    ]
    assert man["label_mapping"]["source_counts"] == {
        "bad": int((y == "bad").sum()),
        "good": int((y == "good").sum()),
    }


def test_l2_normalisation(tmp_path):
    rows = "\n".join(f"{i % 2},{i + 1},{2 * i},0" for i in range(40))
    (tmp_path / "n.csv").write_text(rows + "\n")
    prep_csv(
        tmp_path / "n.csv",
        tmp_path / "ds",
        label_column="0",
        header=False,
        l2_normalize=True,
        split="train=1",
        progress=False,
    )
    X = ShardedDataset(tmp_path / "ds").to_csr("train").X
    np.testing.assert_allclose(np.sqrt(X.multiply(X).sum(axis=1)).A1, 1.0, rtol=1e-6)


EXPECTED = {  # (pos, neg, features) from each MANIFEST.json and its label rule
    "spambase": (2788, 1813, 57),
    "heart_statlog": (150, 120, 13),
    "sonar": (111, 97, 60),
    "ionosphere": (225, 126, 34),
    "breast_cancer_wisconsin_diagnostic": (357, 212, 30),
    "breast_cancer_wisconsin_original": (444, 239, 9),  # 683 rows without "?"
    "ecoli1": (259, 77, 7),
    "ecoli3": (301, 35, 7),
    "hill_valley": (606, 606, 100),
    "psm_pin_mokapot_10k": (None, None, 11),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipes(shared_data, tmp_path, name):
    run_recipe(name, tmp_path / name, progress=False)
    ds = ShardedDataset(tmp_path / name, verify=True)
    pos = sum(ds.class_counts(s)["pos"] for s in ds.splits)
    neg = sum(ds.class_counts(s)["neg"] for s in ds.splits)
    want_pos, want_neg, d = EXPECTED[name]
    assert ds.n_features == d
    if want_pos is not None:
        assert (pos, neg) == (want_pos, want_neg)
    else:  # the pin file: targets vs decoys as counted from the raw file
        with gzip.open(shared_data / name / "10k_psms_test.pin.gz", "rt") as f:
            labels = [line.split("\t")[1] for line in f.read().splitlines()[1:]]
        assert (pos, neg) == (labels.count("1"), labels.count("-1"))
        assert ds.manifest["preprocessing"]["feature_columns"][0] == "MS8_feature_5"
    assert set(RECIPES) >= set(EXPECTED) | {"a9a"}


def test_sonar_values_match_the_raw_file(shared_data, tmp_path):
    raw = np.loadtxt(
        shared_data / "sonar" / "sonar.csv", delimiter=",", usecols=range(60)
    )
    kw = dict(progress=False, split="train=1")
    run_recipe("sonar", tmp_path / "r", standardize=False, **kw)
    got = ShardedDataset(tmp_path / "r").to_csr("train")
    np.testing.assert_array_equal(got.X.toarray(), raw.astype(np.float32))
    # by default the dense recipes standardise (here every row is a train row)
    run_recipe("sonar", tmp_path / "s", **kw)
    got = ShardedDataset(tmp_path / "s").to_csr("train")
    want = (raw - raw.mean(0)) / raw.std(0)
    np.testing.assert_allclose(got.X.toarray(), want, rtol=1e-5, atol=1e-5)


def test_synth_is_deterministic_across_thread_counts(tmp_path):
    kw = dict(rows=30_000, features=3000, block_rows=7000, progress=False, seed=4)
    a = prep_synth(tmp_path / "a", jobs=1, **kw)
    b = prep_synth(tmp_path / "b", jobs=3, **kw)
    assert [f["sha256"] for f in a["files"]] == [f["sha256"] for f in b["files"]]
    ds = ShardedDataset(tmp_path / "a")
    tr = ds.to_csr("train")
    nnz_row = tr.X.nnz / len(tr)
    assert 60 < nnz_row < 92
    neg_share = sum(ds.class_counts(s)["neg"] for s in ds.splits) / 30_000
    assert 0.12 < neg_share < 0.18
    np.testing.assert_allclose(
        np.sqrt(tr.X.multiply(tr.X).sum(axis=1)).A1, 1.0, rtol=1e-5
    )
    assert np.all(np.diff(tr.X.indptr) > 0)
    all_ids = np.concatenate([ds.to_csr(s).row_id for s in ds.splits])
    assert np.array_equal(np.sort(all_ids), np.arange(30_000))
    c = prep_synth(tmp_path / "c", jobs=2, **{**kw, "seed": 5})
    assert c["files"][0]["sha256"] != a["files"][0]["sha256"]


def test_synth_labels_are_learnable(tmp_path):
    from sklearn.linear_model import LogisticRegression

    prep_synth(tmp_path / "s", rows=40_000, features=5000, progress=False)
    ds = ShardedDataset(tmp_path / "s")
    tr, te = ds.to_csr("train"), ds.to_csr("test")
    acc = LogisticRegression(C=10, max_iter=500).fit(tr.X, tr.y).score(te.X, te.y)
    base = max((te.y == 1).mean(), (te.y == -1).mean())
    assert acc > base + 0.03


def test_cli_info_and_json(tmp_path):
    p = run_cli(
        "prep", "synth", "--rows", "2000", "--features", "300", "--out", tmp_path / "s"
    )
    assert p.returncode == 0, p.stderr
    assert "features     300" in p.stdout and "[bigrate] prep synth" in p.stderr
    p = run_cli("info", tmp_path / "s", "--verify", check=True)
    assert "verified     sha256, rows" in p.stdout and "train" in p.stdout
    man = json.loads(run_cli("info", tmp_path / "s", "--json", check=True).stdout)
    assert man["n_features"] == 300 and man["command"].startswith("bigrate prep synth")
