"""Standardised dense features: statistics of the train split only (streamed and
merged exactly), stored in the manifest, applied to every split, and carried by a
trained model to the data it scores (raw, the same map, or another map)."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from bigrate.data import ShardedDataset
from bigrate.data.prep import prep_csv, run_recipe
from bigrate.data.standardize import RunningMoments, Standardizer, convert
from bigrate.errors import DataError
from tests.conftest import run_cli


def test_running_moments_equal_numpy_on_sparse_blocks():
    rng = np.random.default_rng(0)
    d = 7
    dense = rng.standard_normal((500, d)) * [1, 10, 1e3, 0.01, 5, 1, 1] + [
        0, 5, -1e4, 0, 1, 0, 3,
    ]  # fmt: skip
    dense[rng.random(dense.shape) < 0.3] = 0.0  # zeros are absent entries
    dense[:, 5] = 0.0  # a feature never present
    m = RunningMoments(d)
    for a, b in [(0, 1), (1, 40), (40, 41), (41, 300), (300, 500)]:
        m.update(sp.csr_matrix(dense[a:b]))
    s = m.standardizer()
    np.testing.assert_allclose(s.mean, dense.mean(0), rtol=1e-12, atol=1e-12)
    std = dense.std(0)
    np.testing.assert_allclose(s.scale[std > 0], std[std > 0], rtol=1e-10)
    assert s.scale[5] == 1.0 and s.n_rows == 500


def _csv(path, n=400, seed=0):
    """Features on very different scales; the label depends on two of them."""
    rng = np.random.default_rng(seed)
    a = rng.normal(1000.0, 200.0, n)
    b = rng.normal(0.0, 0.01, n)
    c = rng.integers(0, 3, n).astype(float)  # many zeros
    z = (a - 1000) / 200 + b / 0.01 + 0.5 * rng.standard_normal(n)
    feats = np.column_stack([a, b, c])
    table = np.column_stack([feats, np.where(z > 0, 1, 0)])
    np.savetxt(path, table, delimiter=",", header="a,b,c,label", comments="",
               fmt=["%.17g", "%.17g", "%.17g", "%d"])  # fmt: skip
    return feats


def test_prep_csv_standardises_with_train_statistics_only(tmp_path):
    feats = _csv(tmp_path / "d.csv")
    kw = dict(label_column="label", split="train=0.6,val=0.2,test=0.2", progress=False)
    prep_csv(tmp_path / "d.csv", tmp_path / "raw", **kw)
    man = prep_csv(tmp_path / "d.csv", tmp_path / "std", standardize=True, **kw)
    raw, std = (
        ShardedDataset(tmp_path / "raw"),
        ShardedDataset(tmp_path / "std", verify=True),
    )
    rec = man["preprocessing"]["standardize"]
    train_ids = raw.to_csr("train").row_id
    # the stored statistics are those of the train rows (row_id = source row), not
    # of the whole file
    np.testing.assert_allclose(rec["mean"], feats[train_ids].mean(0), rtol=1e-6)
    np.testing.assert_allclose(rec["scale"], feats[train_ids].std(0), rtol=1e-6)
    assert abs(rec["mean"][0] - feats[:, 0].mean()) > 1e-6
    assert rec["rows"] == len(train_ids)
    for split in ("train", "val", "test"):
        r, s = raw.to_csr(split), std.to_csr(split)
        np.testing.assert_array_equal(r.row_id, s.row_id)
        want = (feats[r.row_id] - rec["mean"]) / rec["scale"]
        np.testing.assert_allclose(s.X.toarray(), want, rtol=1e-5, atol=1e-5)
    t = std.to_csr("train").X.toarray()
    np.testing.assert_allclose(t.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(t.std(0), 1, atol=1e-5)
    assert "standardised" in std.summary()
    # the rewritten files keep the manifest's row groups and checksums consistent
    for f in std.files():
        assert pq.ParquetFile(std.root + "/" + f.path).metadata.num_rows == f.rows


def test_models_apply_the_training_map_to_the_data_they_score(tmp_path):
    _csv(tmp_path / "d.csv", n=600)
    other = _csv(tmp_path / "other.csv", n=300, seed=5)
    common = ["--label-column", "label", "--quiet", "--split", "train=0.7,val=0.3"]
    for name, src, extra in [
        ("std", "d.csv", ["--standardize"]),
        ("raw", "d.csv", []),
        ("other", "other.csv", ["--standardize"]),  # its own, different statistics
    ]:
        p = run_cli(
            "prep", "csv", tmp_path / src, "--out", tmp_path / name, *common, *extra
        )
        assert p.returncode == 0, p.stderr
    p = run_cli(
        "train", tmp_path / "std", "--rho", "0.1", "--param", "epochs=3",
        "--engine", "local", "--out", tmp_path / "run", "--quiet",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    inputs = json.loads((tmp_path / "run/model/model.json").read_text())["inputs"]
    assert (
        inputs["standardize"]["mean"]
        == ShardedDataset(tmp_path / "std").manifest["preprocessing"]["standardize"][
            "mean"
        ]
    )
    scores = {}
    for name in ("std", "raw", "other"):
        out = tmp_path / f"{name}.parquet"
        p = run_cli("predict", tmp_path / "run", tmp_path / name, "--out", out)
        assert p.returncode == 0, p.stderr
        assert ("rows mapped" in p.stderr) == (name != "std")
        t = pq.read_table(out)
        order = np.argsort(t["row_id"].to_numpy())
        scores[name] = (t["row_id"].to_numpy()[order], t["score"].to_numpy()[order])
    # the raw copy of the same file gets the same scores as the standardised one
    np.testing.assert_array_equal(scores["raw"][0], scores["std"][0])
    np.testing.assert_allclose(scores["raw"][1], scores["std"][1], atol=1e-4)
    # another dataset standardised its own way is scored in the model's space
    from bigrate.io import load_model

    est = load_model(tmp_path / "run/model")
    rec = inputs["standardize"]
    ids, got = scores["other"]
    feats = (other[ids] - rec["mean"]) / rec["scale"]
    np.testing.assert_allclose(got, est.decision_function(feats), atol=1e-4)


def test_convert_between_maps_round_trips():
    rng = np.random.default_rng(1)
    X = sp.csr_matrix(rng.standard_normal((20, 4)) * 3 + 1)
    s1 = Standardizer(mean=np.array([1.0, 2, 3, 4]), scale=np.array([1.0, 2, 0.5, 3]))
    s2 = Standardizer(mean=np.zeros(4), scale=np.full(4, 2.0))
    in1 = s1.apply(X)
    np.testing.assert_allclose(
        convert(in1, s1, s2).toarray(), s2.apply(X).toarray(), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(convert(in1, s1, None).toarray(), X.toarray(), rtol=1e-5)
    assert convert(in1, s1, s1) is in1


def test_bad_requests_and_bad_manifests_are_named(tmp_path):
    _csv(tmp_path / "d.csv", n=100)
    with pytest.raises(ValueError, match="exclude each other"):
        prep_csv(tmp_path / "d.csv", tmp_path / "x", label_column="label",
                 standardize=True, l2_normalize=True, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="sparse one-hot"):
        run_recipe("a9a", tmp_path / "a9a", standardize=True, progress=False)
    prep_csv(tmp_path / "d.csv", tmp_path / "s", label_column="label",
             standardize=True, progress=False)  # fmt: skip
    mf = tmp_path / "s/manifest.json"
    m = json.loads(mf.read_text())
    m["preprocessing"]["standardize"]["scale"] = [1.0, 0.0, 1.0]
    mf.write_text(json.dumps(m))
    with pytest.raises(DataError, match="scale must be positive") as e:
        ShardedDataset(tmp_path / "s")
    assert "manifest.json" in str(e.value)
    m["preprocessing"]["standardize"]["scale"] = [1.0, 2.0]
    mf.write_text(json.dumps(m))
    with pytest.raises(DataError, match="one per feature"):
        ShardedDataset(tmp_path / "s")
