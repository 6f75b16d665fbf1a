"""svmlight -> shards -> CSR gives back exactly what scikit-learn's reader gives."""

import bz2
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.datasets import load_svmlight_file

from bigrate.data import ShardedDataset
from bigrate.data.prep import prep_svmlight, run_recipe
from tests.conftest import random_svmlight


def assert_same_csr(A, B):
    A.sort_indices()
    B.sort_indices()
    assert A.shape == B.shape
    np.testing.assert_array_equal(A.indptr, B.indptr)
    np.testing.assert_array_equal(A.indices, B.indices)
    np.testing.assert_array_equal(A.data, B.data.astype(np.float32))


def test_a9a_train_file_round_trip_is_exact(shared_data, tmp_path):
    src = shared_data / "a9a" / "a9a.bz2"
    prep_svmlight(
        [src],
        tmp_path / "ds",
        split="train=1",
        positive_labels=["-1"],
        negative_labels=["1"],
        progress=False,
        chunk_bytes=256 << 10,
    )
    ds = ShardedDataset(tmp_path / "ds", verify=True)
    X, y = load_svmlight_file(str(src))
    got = ds.to_csr("train")
    assert_same_csr(got.X, X)
    np.testing.assert_array_equal(got.y, np.where(y == -1, 1, -1))
    np.testing.assert_array_equal(got.row_id, np.arange(len(y)))
    assert ds.class_counts("train") == {"pos": 24720, "neg": 7841}
    assert ds.n_features == 123


def test_a9a_recipe_splits_partition_the_rows(shared_data, tmp_path):
    man = run_recipe("a9a", tmp_path / "a9a", progress=False)
    ds = ShardedDataset(tmp_path / "a9a")
    assert man["label_mapping"]["positive"] == ["-1"]
    assert [s["name"] for s in man["sources"]] == ["a9a.bz2", "a9a.t.bz2"]
    # exact stratification: round(n_c * 0.9) of each class in train
    assert ds.class_counts("train") == {
        "pos": round(24720 * 0.9),
        "neg": round(7841 * 0.9),
    }
    assert ds.class_counts("test") == {"pos": 12435, "neg": 3846}
    Xtr, ytr = load_svmlight_file(str(shared_data / "a9a" / "a9a.bz2"), n_features=123)
    Xte, yte = load_svmlight_file(
        str(shared_data / "a9a" / "a9a.t.bz2"), n_features=123
    )
    blocks = [ds.to_csr(s) for s in ("train", "val", "test")]
    rid = np.concatenate([b.row_id for b in blocks])
    order = np.argsort(rid)
    assert np.array_equal(rid[order], np.arange(len(ytr) + len(yte)))
    import scipy.sparse as sp

    allX = sp.vstack([b.X for b in blocks], format="csr")[order]
    assert_same_csr(allX, sp.vstack([Xtr, Xte], format="csr"))
    test = ds.to_csr("test")
    assert_same_csr(test.X, Xte)


@pytest.mark.parametrize("chunk", [1024, 1 << 20])
def test_edge_cases_round_trip(tmp_path, chunk):
    src = random_svmlight(tmp_path / "edge.svm", n=3000, d=500, seed=3)
    prep_svmlight(
        [src], tmp_path / "ds", split="train=1", progress=False, chunk_bytes=chunk
    )
    ds = ShardedDataset(tmp_path / "ds")
    X, y = load_svmlight_file(str(src), zero_based=False)
    got = ds.to_csr("train")
    assert (np.diff(X.indptr) == 0).sum() > 50  # the file really has empty rows
    assert got.X.shape[1] == 500 == X.shape[1]
    assert_same_csr(got.X, X)
    np.testing.assert_array_equal(got.y, y.astype(np.int8))


def test_compressed_input_and_zero_based(tmp_path):
    text = "1 0:1.5 3:2\n-1 2:0.25\n1\n-1 0:-1\n"
    (tmp_path / "z.svm.bz2").write_bytes(bz2.compress(text.encode()))
    prep_svmlight(
        [tmp_path / "z.svm.bz2"],
        tmp_path / "ds",
        split="train=1",
        zero_based=True,
        progress=False,
    )
    got = ShardedDataset(tmp_path / "ds").to_csr("train")
    np.testing.assert_array_equal(
        got.X.toarray(), [[1.5, 0, 0, 2], [0, 0, 0.25, 0], [0, 0, 0, 0], [-1, 0, 0, 0]]
    )


def test_split_is_exact_and_independent_of_chunking(tmp_path):
    src = random_svmlight(tmp_path / "s.svm", n=20000, d=50, seed=1, p_empty=0.0)
    mans = []
    for k, chunk in enumerate([2048, 64 << 20]):
        mans.append(
            prep_svmlight(
                [src],
                tmp_path / f"d{k}",
                split="train=0.7,val=0.2,test=0.1",
                seed=5,
                progress=False,
                chunk_bytes=chunk,
            )
        )
    a, b = (ShardedDataset(tmp_path / f"d{k}") for k in range(2))
    _, y = load_svmlight_file(str(src))
    npos, nneg = int((y == 1).sum()), int((y == -1).sum())
    for s, lo, hi in (("train", 0.0, 0.7), ("val", 0.7, 0.9), ("test", 0.9, 1.0)):
        want = {
            "pos": round(npos * hi) - round(npos * lo),
            "neg": round(nneg * hi) - round(nneg * lo),
        }
        assert a.class_counts(s) == want == b.class_counts(s)
        np.testing.assert_array_equal(a.to_csr(s).row_id, b.to_csr(s).row_id)
    # a different seed gives a different (but equally exact) split
    prep_svmlight(
        [src],
        tmp_path / "d2",
        split="train=0.7,val=0.2,test=0.1",
        seed=6,
        progress=False,
    )
    c = ShardedDataset(tmp_path / "d2")
    assert c.class_counts("val") == a.class_counts("val")
    assert not np.array_equal(c.to_csr("val").row_id, a.to_csr("val").row_id)


def test_row_groups_files_and_schema(tmp_path):
    src = random_svmlight(tmp_path / "s.svm", n=5000, d=40, seed=2, p_empty=0.0)
    man = prep_svmlight(
        [src],
        tmp_path / "ds",
        split="train=1",
        row_group_size=300,
        rows_per_file=1200,
        progress=False,
    )
    ds = ShardedDataset(tmp_path / "ds")
    files = ds.files("train", "pos")
    assert len(files) == -(-ds.class_counts("train")["pos"] // 1200)
    for f in ds.files():
        meta = pq.ParquetFile(tmp_path / "ds" / f.path).metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(s == 300 for s in sizes[:-1]) and sizes[-1] <= 300
        assert meta.num_row_groups == f.row_groups and meta.num_rows == f.rows
    sch = pq.read_schema(tmp_path / "ds" / files[0].path)
    import pyarrow as pa

    assert sch.field("indices").type.value_type == pa.int32()
    assert sch.field("values").type.value_type == pa.float32()
    assert (
        sch.field("row_id").type.bit_width == 64
        and sch.field("label").type.bit_width == 8
    )
    on_disk = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert on_disk == man
    for key in (
        "format_version",
        "n_features",
        "rows",
        "files",
        "label_mapping",
        "preprocessing",
        "sources",
        "command",
    ):
        assert key in man
    # batches are bounded and cover the split exactly once
    seen = []
    for b in ds.iter_batches("train", batch_rows=128):
        assert len(b) <= 128 and b.X.dtype == np.float32
        seen.append(b.row_id)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(5000))
