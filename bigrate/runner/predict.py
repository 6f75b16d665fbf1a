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
    """Write row_id, split, label, score and prediction of every row; returns the count.
    The rows are first expressed in the model's feature space (its training data's
    standardisation, see :mod:`bigrate.runner.modelio`). The file is written to a
    temporary name and renamed into place."""
    p = Path(run_or_model)
    model_dir = p / "model" if (p / "model" / "model.json").exists() else p
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
    schema = pa.schema(
        [
            ("row_id", pa.int64()),
            ("split", pa.string()),
            ("label", pa.int8()),
            ("score", pa.float64()),
            ("prediction", pa.int8()),
        ]
    )
    n = 0
    try:
        with pq.ParquetWriter(tmp, schema) as w:
            for split in splits:
                for b in ds.iter_batches(split, batch_rows=batch_rows):
                    f = score(b.X)
                    w.write_table(
                        pa.table(
                            {
                                "row_id": b.row_id,
                                "split": [split] * len(b),
                                "label": b.y,
                                "score": f,
                                "prediction": np.where(f >= 0, 1, -1).astype(np.int8),
                            },
                            schema=schema,
                        )
                    )
                    n += len(b)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n
