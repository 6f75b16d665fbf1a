"""The data layer: the Parquet shard format, its reader and writer, and converters."""

from bigrate.data.format import CLASSES, SPLITS, RowBlock
from bigrate.data.reader import DatasetRef, ShardedDataset, ShardFile
from bigrate.data.writer import DatasetWriter

__all__ = [
    "CLASSES",
    "SPLITS",
    "DatasetRef",
    "DatasetWriter",
    "RowBlock",
    "ShardFile",
    "ShardedDataset",
]
