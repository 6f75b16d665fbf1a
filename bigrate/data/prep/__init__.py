"""Converters into the shard format (used by `bigrate prep` and `data_prep/`)."""

from bigrate.data.prep.csv import prep_csv, prep_pin
from bigrate.data.prep.recipes import RECIPES, find_shared_data, run_recipe
from bigrate.data.prep.svmlight import prep_svmlight
from bigrate.data.prep.synth import prep_synth

__all__ = [
    "RECIPES",
    "find_shared_data",
    "prep_csv",
    "prep_pin",
    "prep_svmlight",
    "prep_synth",
    "run_recipe",
]
