"""Prepare the public datasets of ../shared/data as bigrate shards.

    python data_prep/prepare_shared.py                 # every recipe into data/<name>
    python data_prep/prepare_shared.py a9a spambase    # only these
    python data_prep/prepare_shared.py --out /scratch/shards --overwrite

Each recipe (bigrate/data/prep/recipes.py) checks the source files' sha256 against their
MANIFEST.json and applies the label mapping that manifest states. The same recipes are
available one at a time as `bigrate prep recipe NAME --out DIR`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bigrate.data import ShardedDataset
from bigrate.data.prep import RECIPES, run_recipe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "names", nargs="*", help=f"recipes (default all): {', '.join(RECIPES)}"
    )
    ap.add_argument("--out", default="data", help="parent folder of the datasets")
    ap.add_argument("--shared", help="the shared data folder (default ../shared/data)")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    for name in a.names or list(RECIPES):
        out = Path(a.out) / name
        run_recipe(name, out, shared=a.shared, overwrite=a.overwrite, progress=False)
        ds = ShardedDataset(out)
        counts = ", ".join(
            f"{s} {ds.class_counts(s)['pos']}+/{ds.class_counts(s)['neg']}-"
            for s in ds.splits
        )
        print(f"{name:<36} {ds.n_features:>6} features  {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
