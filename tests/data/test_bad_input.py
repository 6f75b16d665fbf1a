"""Every bad input gets a clear error, a non-zero exit, and leaves nothing behind."""

import gzip

import numpy as np
import pytest

from bigrate.data import ShardedDataset
from bigrate.data.prep import prep_csv, prep_svmlight
from bigrate.errors import ChecksumError, DataError, DatasetExistsError
from tests.conftest import random_svmlight, run_cli, write_svmlight_text


def nothing_left(parent, name="ds"):
    """No dataset and no temporary directory of it in ``parent``."""
    return not (parent / name).exists() and not list(parent.glob(f".{name}.*"))


GOOD = [f"{1 if i % 3 else -1} {i % 5 + 1}:{i}.5 9:1" for i in range(40)]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("1 3:1 x:2", "feature index 'x' is not a non-negative integer"),
        ("1 3:1 4:abc", "value 'abc' of feature 4 is not a number"),
        ("one 3:1", "label 'one' is not a number"),
        ("1 3:1 3:2", "feature 3 appears twice"),
        ("1 5:1 3:2", "feature indices are not sorted (5 then 3)"),
        ("1 0:1", "feature index 0 in a one-based file"),
        ("1 3:1 7", "expected INDEX:VALUE, got '7'"),
    ],
)
def test_malformed_svmlight_names_file_and_line(tmp_path, bad_line, message):
    rows = GOOD[:25] + [bad_line] + GOOD[25:]
    src = write_svmlight_text(tmp_path / "bad.svm", rows)
    with pytest.raises(DataError) as e:
        prep_svmlight([src], tmp_path / "ds", progress=False, chunk_bytes=1024)
    assert f"bad.svm:26: {message}" in str(e.value)
    assert e.value.line == 26
    assert nothing_left(tmp_path)


def test_cli_malformed_line_exits_nonzero(tmp_path):
    rows = GOOD[:10] + ["1 2:3 2:4"] + GOOD[10:]
    src = write_svmlight_text(tmp_path / "bad.svm", rows)
    p = run_cli("prep", "svmlight", src, "--out", tmp_path / "ds", "--quiet")
    assert p.returncode == 2
    assert "bad.svm:11: feature 2 appears twice" in p.stderr
    assert "Traceback" not in p.stderr
    assert nothing_left(tmp_path)


def test_three_labels_lists_the_labels(tmp_path):
    src = random_svmlight(tmp_path / "three.svm", n=300, d=10, labels=(-1, 1, 2))
    with pytest.raises(DataError, match=r"labels found \['-1', '1', '2'\]"):
        prep_svmlight([src], tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path)


def test_unmapped_label_with_explicit_mapping(tmp_path):
    rows = GOOD[:30] + ["3 1:1"] + GOOD[30:]
    src = write_svmlight_text(tmp_path / "l.svm", rows)
    with pytest.raises(DataError, match=r"l.svm:31: label '3' is neither positive"):
        prep_svmlight(
            [src],
            tmp_path / "ds",
            positive_labels=["1"],
            negative_labels=["-1"],
            progress=False,
        )
    assert nothing_left(tmp_path)


def test_single_class_after_mapping(tmp_path):
    src = write_svmlight_text(tmp_path / "one.svm", ["1 1:1"] * 20)
    with pytest.raises(DataError, match="only one class"):
        prep_svmlight([src], tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_values(tmp_path, value):
    rows = GOOD[:12] + [f"1 2:{value}"] + GOOD[12:]
    src = write_svmlight_text(tmp_path / "nf.svm", rows)
    with pytest.raises(DataError, match=r"nf.svm:13: non-finite value"):
        prep_svmlight([src], tmp_path / "ds", progress=False)
    assert nothing_left(tmp_path)


def test_empty_class_in_a_split(tmp_path):
    rows = [f"1 1:{i}" for i in range(50)] + ["-1 1:1"] * 3
    src = write_svmlight_text(tmp_path / "few.svm", rows)
    with pytest.raises(DataError, match=r"split 'val' has no rows of class 'neg'"):
        prep_svmlight([src], tmp_path / "ds", split="train=0.9,val=0.1", progress=False)
    assert nothing_left(tmp_path)


def test_feature_beyond_declared_width(tmp_path):
    src = write_svmlight_text(tmp_path / "w.svm", GOOD[:5] + ["1 1:1 124:1"] + GOOD[5:])
    with pytest.raises(
        DataError, match=r"w.svm:6: feature index 124 is beyond n_features=123"
    ):
        prep_svmlight([src], tmp_path / "ds", n_features=123, progress=False)


def test_csv_non_numeric_cell_names_file_line_column(tmp_path):
    lines = ["a,b,label"] + [f"{i},{i * 2},{i % 2}" for i in range(30)]
    lines[18] = "17,oops,1"
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
        prep_csv(path, tmp_path / "ds", label_column="label", progress=False)
    assert "t.csv:19 (column 'b'): cell 'oops' is not a number" in str(e.value)
    assert nothing_left(tmp_path)
    p = run_cli(
        "prep", "csv", path, "--label-column", "label", "--out", tmp_path / "ds"
    )
    assert p.returncode == 2 and "t.csv:19 (column 'b')" in p.stderr


def test_csv_input_is_read_only_by_the_calling_thread(tmp_path, monkeypatch):
    """Arrow parses blocks from memory; it never reads the (Python) input file on its
    IO threads. Such a thread, still reading ahead when an error ends the process,
    aborts the interpreter's shutdown (SIGABRT, "terminate called without an active
    exception": a CI run saw ``bigrate prep csv`` exit -6 instead of 2)."""
    import threading

    from bigrate.data.prep import common

    readers = set()
    readinto = common._HashingReader.readinto

    def recording(self, b):
        readers.add(threading.get_ident())
        return readinto(self, b)

    monkeypatch.setattr(common._HashingReader, "readinto", recording)
    lines = ["a,b,label"] + [f"{i},{i * 2},{i % 2}" for i in range(3000)]
    good = tmp_path / "good.csv"
    good.write_text("\n".join(lines) + "\n")
    lines[2500] = "2499,oops,1"
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    man = prep_csv(good, tmp_path / "ds", label_column="label", progress=False,
                   block_bytes=4096, split="train=1")  # fmt: skip
    assert man["label_mapping"]
    X = ShardedDataset(tmp_path / "ds").to_csr("train").X.toarray()
    assert np.array_equal(X[:, 1], 2.0 * np.arange(3000))
    with pytest.raises(DataError, match=r"bad.csv.gz:2501 \(column 'b'\): cell 'oo"):
        prep_csv(bad, tmp_path / "ds2", label_column="label", progress=False,
                 block_bytes=4096)  # fmt: skip
    assert readers == {threading.get_ident()}


def test_csv_missing_and_nan_cells(tmp_path):
    lines = ["a,b,label"] + [f"{i},{i * 2},{i % 2}" for i in range(30)]
    lines[6] = "5,?,1"
    path = tmp_path / "m.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(DataError, match=r"m.csv.gz:7 \(column 'b'\): missing, NaN"):
        prep_csv(path, tmp_path / "ds", label_column="label", progress=False)
    man = prep_csv(
        path,
        tmp_path / "ds",
        label_column="label",
        drop_missing=True,
        progress=False,
        split="train=1",
    )
    assert man["preprocessing"]["rows_dropped_for_missing_values"] == 1
    assert ShardedDataset(tmp_path / "ds").n_rows("train") == 29
    for cell in ("nan", "inf"):  # numbers to the parser, missing to the user
        lines[6] = f"5,{cell},1"
        path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
        with pytest.raises(
            DataError, match=r"m.csv.gz:7 \(column 'b'\): missing, NaN or infinite"
        ):
            prep_csv(path, tmp_path / "ds2", label_column="label", progress=False,
                     overwrite=True)  # fmt: skip
        man = prep_csv(
            path, tmp_path / "ds2", label_column="label", drop_missing=True,
            progress=False, split="train=1", overwrite=True,
        )  # fmt: skip
        assert man["preprocessing"]["rows_dropped_for_missing_values"] == 1
        X = ShardedDataset(tmp_path / "ds2").to_csr("train").X
        assert X.shape[0] == 29 and np.isfinite(X.data).all()


def test_existing_dataset_needs_overwrite(tmp_path):
    src = random_svmlight(tmp_path / "s.svm", n=400, d=10)
    prep_svmlight([src], tmp_path / "ds", progress=False)
    before = (tmp_path / "ds" / "manifest.json").read_text()
    with pytest.raises(DatasetExistsError, match="already holds a dataset"):
        prep_svmlight([src], tmp_path / "ds", progress=False)
    p = run_cli("prep", "svmlight", src, "--out", tmp_path / "ds", "--quiet")
    assert p.returncode == 2 and "--overwrite" in p.stderr
    assert (tmp_path / "ds" / "manifest.json").read_text() == before
    prep_svmlight([src], tmp_path / "ds", progress=False, overwrite=True, seed=3)
    assert (tmp_path / "ds" / "manifest.json").read_text() != before
    assert not list(tmp_path.glob(".ds.*"))
    # a failed overwrite keeps the old dataset intact
    bad = write_svmlight_text(tmp_path / "bad.svm", GOOD + ["1 1:x"])
    with pytest.raises(DataError):
        prep_svmlight([bad], tmp_path / "ds", progress=False, overwrite=True)
    ShardedDataset(tmp_path / "ds", verify=True)


def test_refuses_to_write_into_a_foreign_directory(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    src = random_svmlight(tmp_path / "s.svm", n=200, d=10)
    with pytest.raises(DatasetExistsError, match="not a bigrate dataset"):
        prep_svmlight([src], tmp_path / "ds", progress=False, overwrite=True)
    assert (tmp_path / "ds" / "notes.txt").read_text() == "mine"


def test_bad_parameters(tmp_path):
    src = random_svmlight(tmp_path / "s.svm", n=50, d=10)
    with pytest.raises(ValueError, match="fractions must sum to 1"):
        prep_svmlight([src], tmp_path / "ds", split="train=0.5,val=0.1")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        prep_svmlight([src], tmp_path / "ds", split="train=0.9,dev=0.1")
    with pytest.raises(FileNotFoundError, match="missing.svm: input file not found"):
        prep_svmlight([tmp_path / "missing.svm"], tmp_path / "ds")
    assert nothing_left(tmp_path)


def test_checksum_verification_names_the_file(tmp_path):
    src = random_svmlight(tmp_path / "s.svm", n=400, d=10)
    prep_svmlight([src], tmp_path / "ds", progress=False)
    ds = ShardedDataset(tmp_path / "ds", verify=True)
    victim = tmp_path / "ds" / ds.files("val", "neg")[0].path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"val/neg/part-00000.parquet: sha256 is"):
        ShardedDataset(tmp_path / "ds", verify=True)
    p = run_cli("info", tmp_path / "ds", "--verify")
    assert p.returncode == 2 and "val/neg/part-00000.parquet" in p.stderr


def test_not_a_dataset(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a bigrate dataset"):
        ShardedDataset(tmp_path)
    (tmp_path / "manifest.json").write_text("{ not json")
    with pytest.raises(DataError, match=r"manifest.json:1: not valid JSON"):
        ShardedDataset(tmp_path)
