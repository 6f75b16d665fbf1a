"""Recipes for the public datasets in ``../shared/data``.

Each recipe checks the source files against the sha256 in the dataset's MANIFEST.json and
applies the label mapping that manifest states (for the UCI two-class sets: the majority
class is positive, the minority class negative; for the pin file: targets positive,
decoys negative).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from bigrate.data.prep.csv import prep_csv, prep_pin
from bigrate.data.prep.svmlight import prep_svmlight
from bigrate.errors import DataError
from bigrate.files import sha256_file


def find_shared_data(shared: str | os.PathLike | None = None) -> Path:
    """The folder of shared datasets: ``shared``, ``$BIGRATE_SHARED_DATA``, or the first
    ``../shared/data`` found from the working directory or from this source tree."""
    cands = []
    if shared:
        cands.append(Path(shared))
    if os.environ.get("BIGRATE_SHARED_DATA"):
        cands.append(Path(os.environ["BIGRATE_SHARED_DATA"]))
    cands.append(Path.cwd().parent / "shared" / "data")
    here = Path(__file__).resolve()
    for up in here.parents:
        cands.append(up.parent / "shared" / "data")
    for c in cands:
        if (c / "a9a" / "MANIFEST.json").is_file():
            return c
    raise FileNotFoundError(
        "cannot find the shared data folder (looked for */a9a/MANIFEST.json in "
        f"{[str(c) for c in cands[:3]]} ...); pass --shared DIR or set BIGRATE_SHARED_DATA"
    )


def _files(shared: Path, name: str) -> dict[str, Path]:
    folder = shared / name
    man = json.loads((folder / "MANIFEST.json").read_text())
    out = {}
    for f in man["files"]:
        p = folder / f["file"]
        got = sha256_file(p)
        if got != f["sha256"]:
            raise DataError(
                f"sha256 {got} differs from MANIFEST.json's {f['sha256']}", path=str(p)
            )
        out[f["file"]] = p
    return out


def _keel_header_lines(path: Path) -> int:
    with open(path, "rb") as f:
        for k, line in enumerate(f):
            if line.strip().lower() == b"@data":
                return k + 1
    raise DataError("no @data line in the KEEL file", path=str(path))


def a9a(shared, out, **kw):
    f = _files(shared, "a9a")
    return prep_svmlight(
        [f["a9a.bz2"]],
        out,
        test_files=[f["a9a.t.bz2"]],
        positive_labels=["-1"],
        negative_labels=["1"],
        n_features=123,
        **kw,
    )


def spambase(shared, out, **kw):
    f = _files(shared, "spambase")
    return prep_csv(
        f["spambase.tsv.gz"],
        out,
        label_column="target",
        delimiter="\t",
        positive_labels=["0"],
        negative_labels=["1"],
        **kw,
    )


def heart_statlog(shared, out, **kw):
    f = _files(shared, "heart_statlog")
    return prep_csv(
        f["heart_statlog.tsv.gz"],
        out,
        label_column="target",
        delimiter="\t",
        positive_labels=["0"],
        negative_labels=["1"],
        **kw,
    )


def sonar(shared, out, **kw):
    f = _files(shared, "sonar")
    return prep_csv(
        f["sonar.csv"],
        out,
        label_column="-1",
        header=False,
        positive_labels=["M"],
        negative_labels=["R"],
        **kw,
    )


def ionosphere(shared, out, **kw):
    f = _files(shared, "ionosphere")
    return prep_csv(
        f["ionosphere.csv"],
        out,
        label_column="-1",
        header=False,
        positive_labels=["g"],
        negative_labels=["b"],
        **kw,
    )


def breast_cancer_wisconsin_diagnostic(shared, out, **kw):
    f = _files(shared, "breast_cancer_wisconsin_diagnostic")
    # one added header line "1,2,...,32": column "1" is the id, "2" the diagnosis
    return prep_csv(
        f["wdbc.data"],
        out,
        label_column="2",
        drop_columns=["1"],
        positive_labels=["B"],
        negative_labels=["M"],
        **kw,
    )


def breast_cancer_wisconsin_original(shared, out, **kw):
    f = _files(shared, "breast_cancer_wisconsin_original")
    kw.setdefault("drop_missing", True)  # the 16 "?" rows: the usual 683-row version
    return prep_csv(
        f["breast-cancer-wisconsin.data"],
        out,
        label_column="10",
        header=False,
        drop_columns=["0"],
        positive_labels=["2"],
        negative_labels=["4"],
        **kw,
    )


def _keel(name):
    def recipe(shared, out, **kw):
        f = _files(shared, name)
        path = f[f"{name}.dat"]
        return prep_csv(
            path,
            out,
            label_column="-1",
            header=False,
            skip_rows=_keel_header_lines(path),
            positive_labels=["negative"],
            negative_labels=["positive"],
            **kw,
        )

    recipe.__doc__ = (
        f"KEEL {name}: majority ('negative' in the file) is our positive class."
    )
    return recipe


def hill_valley(shared, out, **kw):
    f = _files(shared, "hill_valley")
    return prep_csv(
        f["Hill_Valley_with_noise_Training.data.gz"],
        out,
        label_column="class",
        test_file=f["Hill_Valley_with_noise_Testing.data.gz"],
        positive_labels=["1"],
        negative_labels=["0"],
        **kw,
    )


def adult(shared, out, *, overwrite=False, seed=0, split=None, standardize=None,
          progress=True, name=None, command=None, l2_normalize=False,
          row_group_size=None, rows_per_file=None, compression="lz4"):  # fmt: skip
    """UCI Adult with its "sex" column as the rows' group (for fairness constraints):
    the one-hot and standardised features of :func:`bigrate.datasets.load_adult`
    (statistics of adult.data only), adult.data split by ``split`` (default train 0.9,
    val 0.1; seeded, exactly stratified), adult.test as test; ">50K" is the positive
    class."""
    import numpy as np

    from bigrate.data.format import (
        DEFAULT_ROW_GROUP_SIZE,
        DEFAULT_ROWS_PER_FILE,
        RowBlock,
    )
    from bigrate.data.split import StratifiedSplitter, parse_fractions
    from bigrate.data.writer import DatasetWriter
    from bigrate.datasets import load_adult

    if l2_normalize:
        raise ValueError("adult: its features are standardised, not L2-normalised")
    f = _files(shared, "adult")
    data = load_adult(shared)
    fractions = parse_fractions(split or "train=0.9,val=0.1")
    if "test" in fractions:
        raise ValueError(
            "adult: adult.test is the test split; --split divides adult.data into "
            "train and val only (e.g. train=0.9,val=0.1)"
        )
    splits = [*fractions, "test"]
    with DatasetWriter(out, splits=splits, has_group=True, overwrite=overwrite,
                       row_group_size=row_group_size or DEFAULT_ROW_GROUP_SIZE,
                       rows_per_file=rows_per_file or DEFAULT_ROWS_PER_FILE,
                       compression=compression) as w:  # fmt: skip
        start = 0
        for part in ("train", "test"):
            X, y, sex = data[part]
            rows = np.arange(start, start + len(y), dtype=np.int64)
            start += len(y)
            block = RowBlock(X.astype(np.float32).tocsr(), y.astype(np.int8), rows,
                             sex.astype(str))  # fmt: skip
            if part == "test":
                w.append("test", block)
                continue
            splitter = StratifiedSplitter(fractions, seed=seed)
            for s, piece in [*splitter.push(block), *splitter.finish()]:
                w.append(s, piece)
        return w.commit(
            n_features=len(data["feature_names"]),
            label_mapping={"positive": [">50K"], "negative": ["<=50K"]},
            preprocessing={
                "one_hot_and_standardize": "bigrate.datasets.load_adult",
                "feature_names": data["feature_names"],
                "group_column": "sex",
                "split": {
                    "fractions": fractions,
                    "seed": int(seed),
                    "test_files": ["adult.test.gz"],
                },
            },  # fmt: skip
            sources=[
                {"name": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)}
                for p in f.values()
            ],  # fmt: skip
            command=command,
            name=name,
        )


def psm_pin_mokapot_10k(shared, out, **kw):
    f = _files(shared, "psm_pin_mokapot_10k")
    return prep_pin(f["10k_psms_test.pin.gz"], out, **kw)


RECIPES: dict[str, Callable] = {
    "a9a": a9a,
    "adult": adult,
    "spambase": spambase,
    "heart_statlog": heart_statlog,
    "sonar": sonar,
    "ionosphere": ionosphere,
    "breast_cancer_wisconsin_diagnostic": breast_cancer_wisconsin_diagnostic,
    "breast_cancer_wisconsin_original": breast_cancer_wisconsin_original,
    "ecoli1": _keel("ecoli1"),
    "ecoli3": _keel("ecoli3"),
    "hill_valley": hill_valley,
    "psm_pin_mokapot_10k": psm_pin_mokapot_10k,
}


#: recipes of sparse one-hot data, left as they are; every other recipe's features are
#: dense measurements on unrelated scales and are standardised (train-split statistics)
SPARSE_RECIPES = frozenset({"a9a", "adult"})


def run_recipe(dataset: str, out, *, shared=None, standardize=None, **kw) -> dict:
    """Prepare the shared dataset named ``dataset`` into shards at ``out``.
    ``standardize`` (default: True for the dense sets, unless ``l2_normalize``)
    standardises the features with the train split's mean and standard deviation."""
    if dataset not in RECIPES:
        raise ValueError(
            f"unknown recipe {dataset!r}; known: {', '.join(sorted(RECIPES))}"
        )
    if standardize is None:
        standardize = dataset not in SPARSE_RECIPES and not kw.get("l2_normalize")
    if standardize:
        if dataset in SPARSE_RECIPES:
            raise ValueError(
                f"{dataset} is sparse one-hot data; standardising would store every "
                "feature of every row"
            )
        kw["standardize"] = True
    if not kw.get("name"):
        kw["name"] = dataset
    return RECIPES[dataset](find_shared_data(shared), out, **kw)
