"""Corrupted datasets end in a DataError naming the file, never in a crash: the manifest
disagreeing with the shards, truncated or flipped bytes, a missing file, a column of the
wrong type. Training runs in a subprocess (the real `bigrate train`), so that a crash in a
compiled kernel would show as a signal exit code instead of killing the test run."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bigrate import ShardedDataset
from bigrate.errors import ChecksumError, DataError
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    from bigrate.data.prep import prep_synth

    d = tmp_path_factory.mktemp("fuzz") / "clean"
    prep_synth(d, rows=4000, features=300, row_group_size=500, progress=False)
    return d


@pytest.fixture
def ds_copy(clean, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(clean, d)
    return d


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


def _write_manifest(d, m):
    (d / "manifest.json").write_text(json.dumps(m, indent=2))


def _train(d):
    """`bigrate train` on the local engine: (return code, stderr)."""
    p = run_cli("train", d, "--engine", "local", "--rho", "0.1", "--epochs", "1",
                "--quiet")  # fmt: skip
    return p.returncode, p.stderr


def _first_file(d, split="train", cls="pos"):
    return next(f for f in _manifest(d)["files"] if f["split"] == split
                and f["class"] == cls)  # fmt: skip


def test_clean_dataset_passes_every_check(clean):
    ds = ShardedDataset(clean)
    ds.check()
    ds.verify()
    assert run_cli("info", clean, "--verify").returncode == 0


def test_n_features_lowered_in_the_manifest(ds_copy):
    m = _manifest(ds_copy)
    m["n_features"] = 50
    _write_manifest(ds_copy, m)
    ds = ShardedDataset(ds_copy)
    ds.check()  # sizes and footers still agree: only reading the indices can tell
    with pytest.raises(DataError, match=r"part-\d+\.parquet: row_id \d+ has feature "
                       r"index \d+, outside \[0, 50\)"):  # fmt: skip
        ds.verify()
    rc, err = _train(ds_copy)
    assert rc == 2, err
    assert "part-" in err and "outside [0, 50)" in err and "Traceback" not in err
    p = run_cli("info", ds_copy, "--verify")
    assert p.returncode == 2 and "outside [0, 50)" in p.stderr


def test_row_counts_changed_in_the_manifest(ds_copy):
    m = _manifest(ds_copy)
    m["files"][0]["rows"] += 7
    _write_manifest(ds_copy, m)
    with pytest.raises(
        DataError, match=m["files"][0]["path"] + r": Parquet footer has"
    ):
        ShardedDataset(ds_copy).check()
    m["files"][0]["rows"] -= 7
    m["rows"]["train"]["pos"] += 1
    _write_manifest(ds_copy, m)
    with pytest.raises(DataError, match=r"manifest.json: rows\['train'\]\['pos'\]"):
        ShardedDataset(ds_copy).check()
    p = run_cli("info", ds_copy)
    assert p.returncode == 2 and "rows['train']['pos']" in p.stderr


def test_truncated_file(ds_copy):
    f = _first_file(ds_copy)
    victim = ds_copy / f["path"]
    victim.write_bytes(victim.read_bytes()[: f["bytes"] // 2])
    with pytest.raises(DataError, match=f["path"] + r": file is [\d,]+ bytes"):
        ShardedDataset(ds_copy).check()
    p = run_cli("info", ds_copy)  # plain info notices it from the sizes
    assert p.returncode == 2 and f["path"] in p.stderr
    rc, err = _train(ds_copy)
    assert rc == 2 and f["path"] in err and "Traceback" not in err


@pytest.mark.parametrize("where", [0.4, 0.8])
def test_flipped_bytes(ds_copy, where):
    f = _first_file(ds_copy, "train", "neg")
    victim = ds_copy / f["path"]
    data = bytearray(victim.read_bytes())
    k = int(len(data) * where)
    data[k : k + 8] = bytes(b ^ 0xA5 for b in data[k : k + 8])
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=f["path"]):
        ShardedDataset(ds_copy).verify()
    rc, err = _train(ds_copy)  # decodes to other numbers, or fails: never a crash
    assert rc in (0, 2), err
    if rc == 2:
        assert f["path"] in err and "Traceback" not in err


def test_missing_file(ds_copy):
    f = _first_file(ds_copy, "test", "neg")
    (ds_copy / f["path"]).unlink()
    with pytest.raises(DataError, match=f["path"] + ": file listed in the manifest is"
                       " missing"):  # fmt: skip
        ShardedDataset(ds_copy).check()
    with pytest.raises(DataError, match=f["path"]):
        list(ShardedDataset(ds_copy).iter_batches("test"))


@pytest.mark.parametrize(
    "column,typ",
    [("indices", pa.list_(pa.int64())), ("values", pa.list_(pa.float64())),
     ("label", pa.int32())],
)  # fmt: skip
def test_column_of_the_wrong_type(ds_copy, column, typ):
    f = _first_file(ds_copy)
    victim = ds_copy / f["path"]
    t = pq.read_table(victim)
    i = t.schema.get_field_index(column)
    t = t.set_column(i, pa.field(column, typ), t.column(column).cast(typ))
    pq.write_table(t, victim, row_group_size=500)
    with pytest.raises(DataError, match=f"{f['path']}: column {column!r} has type"):
        list(ShardedDataset(ds_copy).iter_batches("train", "pos"))
    # A prep that wrote these types and recorded the file faithfully: the cheap
    # check before training (footers only) names the column, not just a size.
    m = _manifest(ds_copy)
    rec = next(g for g in m["files"] if g["path"] == f["path"])
    rec["bytes"] = victim.stat().st_size
    rec["row_groups"] = pq.ParquetFile(victim).metadata.num_row_groups
    _write_manifest(ds_copy, m)
    with pytest.raises(DataError, match=f"{f['path']}: column {column!r} has type"):
        ShardedDataset(ds_copy).check()
    rc, err = _train(ds_copy)
    assert rc == 2 and f"column {column!r}" in err and "Traceback" not in err


def test_bad_rows_are_named(ds_copy):
    """Unsorted indices, a NaN value and a label of the other class, each written into a
    shard with a consistent manifest: the reader names the file and the row."""
    f = _first_file(ds_copy)
    victim = ds_copy / f["path"]
    t = pq.read_table(victim)
    idx = t.column("indices").to_pylist()
    vals = t.column("values").to_pylist()
    labels = t.column("label").to_numpy().copy()
    r = next(i for i, row in enumerate(idx) if len(row) >= 2)
    rid = t.column("row_id")[r].as_py()
    cases = {
        "not sorted and unique": lambda: idx.__setitem__(r, idx[r][::-1]),
        "NaN or infinite": lambda: vals.__setitem__(r, [np.nan] * len(vals[r])),
        "has label -1": lambda: labels.__setitem__(r, -1),
    }
    for message, corrupt in cases.items():
        i0, v0, l0 = [list(x) for x in idx], [list(x) for x in vals], labels.copy()
        corrupt()
        bad = t.set_column(2, "indices", pa.array(idx, pa.list_(pa.int32())))
        bad = bad.set_column(3, "values", pa.array(vals, pa.list_(pa.float32())))
        bad = bad.set_column(1, "label", pa.array(labels, pa.int8()))
        pq.write_table(bad, victim, row_group_size=500)
        with pytest.raises(DataError, match=rf"{f['path']}: row_id {rid}.*{message}"):
            list(ShardedDataset(ds_copy).iter_batches("train", "pos"))
        idx, vals, labels = i0, v0, l0
