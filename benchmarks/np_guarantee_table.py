"""The guarantee table of BENCHMARKS from saved ``bench_np_guarantee.py`` results.

    python benchmarks/np_guarantee_table.py benchmarks/out/npg_inits/np_guarantee.json \
        benchmarks/out/npg_small/np_guarantee.json benchmarks/out/npg_big/np_guarantee.json

Later files add what earlier ones lack (rows of one set from several runs: bigrate's
from one, nproc's from another; nproc's rows do not depend on bigrate). Prints one
markdown row per set and rho: each bigrate variant's violation rate with its interval
and mean test Pnd, nproc's per base classifier, and whether each goal holds (the
violation interval reaches delta; Pnd at most nproc's best + 0.01)."""

from __future__ import annotations

import json
import sys

RHOS = (0.05, 0.1, 0.2)
NPROC = ("logistic", "svm", "rf")


def merged(paths: list[str]) -> tuple[dict, float]:
    sets: dict = {}
    delta = None
    for p in paths:
        r = json.load(open(p))
        delta = r["delta"]
        for name, rec in r["sets"].items():
            into = sets.setdefault(name, {})
            for k, v in rec.items():
                into.setdefault(k, v)
    return sets, delta


def main() -> None:
    sets, delta = merged(sys.argv[1:])
    variants = sorted({k.split()[0] for s in sets.values() for k in s
                       if k.startswith("bigrate_") and " " in k})  # fmt: skip
    head = ["set", "rho", "test neg."]
    for v in variants:
        head += [f"{v}: violations [95%]", f"{v}: Pnd"]
    head += [f"nproc {m}: viol. / Pnd" for m in NPROC]
    head += [f"{v}: goals (viol. / Pnd)" for v in variants]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, s in sets.items():
        for rho in RHOS:
            row = [name, f"{rho:g}", str(s["test_negatives"])]
            for v in variants:
                b = s.get(f"{v} {rho}")
                if b is None:
                    row += ["-", "-"]
                    continue
                lo, hi = b["violation_interval"]
                row += [f"{b['violation_rate']:.3f} [{lo:.3f}, {hi:.3f}]",
                        f"{b['mean_pnd']:.3f}"]  # fmt: skip
            best = None
            for m in NPROC:
                n = s.get(f"nproc_{m} {rho}")
                if n is None:
                    row.append("not run")
                    continue
                row.append(f"{n['violation_rate']:.3f} / {n['mean_pnd']:.3f}")
                if n["mean_pnd"] < 1.0 and (best is None or n["mean_pnd"] < best):
                    best = n["mean_pnd"]
            for v in variants:
                b = s.get(f"{v} {rho}")
                if b is None:
                    row.append("-")
                    continue
                viol = "yes" if b["violation_interval"][0] <= delta else "**no**"
                if best is None:
                    pnd = "-"
                else:
                    pnd = "yes" if b["mean_pnd"] <= best + 0.01 else "**no**"
                row.append(f"{viol} / {pnd}")
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
