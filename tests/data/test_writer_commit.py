"""Faults injected at the dataset writer's commit and swap, over an old dataset with
overwrite: whichever file operation fails, the target afterwards is the complete old or
the complete new dataset, never a mix (and a re-run then succeeds)."""

import os
import shutil

import pytest

import bigrate.files
from bigrate import ShardedDataset
from bigrate.data.prep import prep_synth

OLD_ROWS, NEW_ROWS = 1200, 1500


class Injected(OSError):
    pass


class FaultAt:
    """Make the k-th file-system mutation (rename, replace, unlink, rmtree, copy) fail,
    counting from the moment it is armed."""

    OPS = [(os, "rename"), (os, "replace"), (os, "unlink"), (shutil, "rmtree"),
           (shutil, "copyfile"), (shutil, "move")]  # fmt: skip

    def __init__(self, monkeypatch, k):
        self.k, self.calls, self.armed = k, 0, False
        for mod, name in self.OPS:
            real = getattr(mod, name)
            monkeypatch.setattr(mod, name, self._wrap(real, name))

    def _wrap(self, real, name):
        def op(*a, **kw):
            if self.armed:
                self.calls += 1
                if self.calls == self.k:
                    raise Injected(f"injected failure of {name} (call {self.k})")
            return real(*a, **kw)

        return op


def _state(target):
    """'old' or 'new' for a complete, self-consistent dataset; fails on anything else."""
    ds = ShardedDataset(target)
    ds.verify()  # manifest, sizes, footers, sha256 and every row agree
    n = sum(ds.n_rows(s) for s in ds.splits)
    assert n in (OLD_ROWS, NEW_ROWS), n
    return "old" if n == OLD_ROWS else "new"


def test_a_fault_at_any_step_of_the_commit_leaves_old_or_new(tmp_path, monkeypatch):
    target = tmp_path / "ds"
    seen = set()
    for k in range(1, 40):
        if target.exists():
            shutil.rmtree(target)
        prep_synth(target, rows=OLD_ROWS, features=200, progress=False)
        fault = FaultAt(monkeypatch, k)
        real_replace_dir = bigrate.files.replace_dir

        def armed_swap(tmp, dst, fault=fault, real=real_replace_dir):
            fault.armed = True  # only the swap into place: parts are written already
            try:
                return real(tmp, dst)
            finally:
                fault.armed = False

        monkeypatch.setattr("bigrate.data.writer.replace_dir", armed_swap)
        try:
            prep_synth(target, rows=NEW_ROWS, features=200, overwrite=True, seed=1,
                       progress=False)  # fmt: skip
            failed = False
        except Injected:
            failed = True
        monkeypatch.undo()
        seen.add(_state(target))
        if not failed:
            assert _state(target) == "new"
            break
    else:
        pytest.fail("the commit never succeeded")
    assert seen == {"old", "new"}, seen  # the faults hit both sides of the swap
    # afterwards a normal overwrite works and leaves no temporaries behind
    prep_synth(target, rows=NEW_ROWS, features=200, overwrite=True, progress=False)
    assert _state(target) == "new"
    stray = [p.name for p in tmp_path.iterdir() if p.name.startswith(".ds.")]
    assert stray == []
