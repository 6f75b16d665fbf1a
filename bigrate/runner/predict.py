"""`bigrate predict`: score a shard dataset with a run's model into a Parquet file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bigrate.data.reader import ShardedDataset
from bigrate.runner.modelio import TrainedModel


def predict(run_or_model, data, out, splits=None, batch_rows: int = 65_536) -> int:
    """Write row_id, split, label, score and prediction of every row (and its group,
    e.g. the spectrum of a PSM, when the dataset has one); returns the count.
    The rows are first expressed in the model's feature space (its training data's
    standardisation, see :mod:`bigrate.runner.modelio`). The file is written to a
    temporary name and renamed into place."""
    p = Path(run_or_model)
    model_dir = p / "model" if (p / "model" / "model.json").exists() else p
    if not (model_dir / "model.json").exists() and (p / "models").is_dir():
        folds = sorted(x.name for x in (p / "models").iterdir() if x.is_dir())
        raise FileNotFoundError(
            f"{p} is a crossfit run: it has no one model, but the score of every row "
            f"of its data in {p / 'scores.parquet'} and a model per fold in "
            f"{p / 'models'} ({', '.join(folds)}); to score other data, name one: "
            f"bigrate predict {p / 'models' / (folds[0] if folds else 'fold-0')} DATA"
        )
    model = TrainedModel(model_dir)
    ds = ShardedDataset(data)
    score = model.scorer(ds)  # rows mapped to the model's standardisation if needed
    note = model.describe_conversion(ds)
    if note:
        print(f"[bigrate] predict: {note}", file=sys.stderr)
    splits = splits or list(ds.splits)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    fields = [
        ("row_id", pa.int64()),
        ("split", pa.string()),
        ("label", pa.int8()),
        ("score", pa.float64()),
        ("prediction", pa.int8()),
    ]
    schema = pa.schema(fields + ([("group", pa.string())] if ds.has_group else []))
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            for split in splits:
                for b in ds.iter_batches(
                    split, batch_rows=batch_rows, with_group=ds.has_group
                ):
                    f = score(b.X)
                    cols = {
                        "row_id": b.row_id,
                        "split": [split] * len(b),
                        "label": b.y,
                        "score": f,
                        "prediction": np.where(f >= 0, 1, -1).astype(np.int8),
                    }
                    if ds.has_group:
                        cols["group"] = b.group
                    w.write_table(pa.table(cols, schema=schema))
                    n += len(b)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


def accepted_at_q(predictions, q: float) -> dict:
    """Targets accepted at ``q`` ((decoys + 1) / targets, as mokapot and Percolator
    report) among the rows of a :func:`predict` file; with a group column (spectra),
    after target-decoy competition: only the best-scoring row of each group counts.
    Returns {"accepted", "rows", "groups"} (groups 0 without a group column)."""
    from bigrate.metrics import best_per_group, positives_at_q

    pf = pq.ParquetFile(predictions)
    names = pf.schema_arrow.names
    t = pf.read(columns=["label", "score"] + (["group"] if "group" in names else []))
    y = t.column("label").to_numpy()
    f = t.column("score").to_numpy()
    groups = 0
    if "group" in names:
        codes = t.column("group").combine_chunks().dictionary_encode().indices
        keep = best_per_group(f, codes.to_numpy(zero_copy_only=False))
        groups = int(keep.sum())
        y, f = y[keep], f[keep]
    return {
        "accepted": positives_at_q(y, f, q, plus_one=True),
        "rows": len(y),
        "groups": groups,
    }
