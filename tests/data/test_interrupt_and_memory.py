"""Killed preps leave no dataset; a file far larger than a memory cap converts."""

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bigrate.data import ShardedDataset
from tests.conftest import default_sigint, run_cli


def _start_synth(out, rows=3_000_000):
    cmd = [
        sys.executable,
        "-m",
        "bigrate.cli",
        "prep",
        "synth",
        "--rows",
        str(rows),
        "--features",
        "20000",
        "--block-rows",
        "20000",
        "--jobs",
        "1",
        "--out",
        str(out),
        "--quiet",
    ]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=default_sigint
    )


def _wait_for_parts(parent, name, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        tmps = list(parent.glob(f".{name}.tmp-*"))
        if tmps and list(tmps[0].rglob("*.parquet")):
            return tmps[0]
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    raise AssertionError("the prep wrote no part file in time")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_interrupted_prep_leaves_no_dataset(tmp_path, sig):
    proc = _start_synth(tmp_path / "ds")
    tmp = _wait_for_parts(tmp_path, "ds", proc)
    proc.send_signal(sig)
    rc = proc.wait(timeout=120)
    assert rc != 0
    assert not (tmp_path / "ds").exists()
    with pytest.raises(FileNotFoundError):
        ShardedDataset(tmp_path / "ds")
    if sig != signal.SIGKILL:  # a catchable signal cleans up its own temporary files
        assert not tmp.exists()
    # the next prep of the same target works, and clears a killed run's leftovers
    p = run_cli(
        "prep",
        "synth",
        "--rows",
        "3000",
        "--features",
        "500",
        "--out",
        tmp_path / "ds",
        "--quiet",
    )
    assert p.returncode == 0, p.stderr
    assert not list(tmp_path.glob(".ds.*"))
    ShardedDataset(tmp_path / "ds", verify=True)


# Linux keeps a process's peak RSS across exec, so a child forked straight from this
# (large) test process would report this process's size. A small launcher process
# forks and execs the command instead, and reports its child's peak.
_LAUNCH = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.executable, [sys.executable, '-m', 'bigrate.cli', *sys.argv[1:]])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "sys.stderr.write(f'\\nPEAK {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}\\n')\n"
)


def _peak_rss_mb(args) -> float:
    p = subprocess.run(
        [sys.executable, "-c", _LAUNCH, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    kb, rc = p.stderr.rsplit("PEAK ", 1)[1].split()
    assert int(rc) == 0, p.stderr
    return int(kb) / 1024.0


def _write_big_svmlight(path, target_bytes, seed=0):
    """Many distinct random rows (written block by block, never held whole)."""
    rng = np.random.default_rng(seed)
    written = 0
    with open(path, "w") as f:
        while written < target_bytes:
            n = 20000
            lab = rng.choice(["1", "-1"], size=n, p=[0.8, 0.2])
            k = 30
            idx = np.sort(rng.choice(5000, size=(n, k)), axis=1) + 1
            idx = idx + np.arange(k) * 5000  # strictly increasing per row
            val = rng.random((n, k))
            cells = np.empty((n, 2 * k), dtype=object)
            cells[:, 0::2], cells[:, 1::2] = idx, val
            row = "%s " + " ".join(["%d:%.4f"] * k)
            text = "".join([row % (lab[i], *cells[i]) + "\n" for i in range(n)])
            f.write(text)
            written += len(text)
    return written


def test_streaming_conversion_stays_under_a_memory_cap(tmp_path):
    """Converting a file 4x the cap takes less than the cap of memory beyond converting
    an eighth of it: memory does not grow with the file (loading it whole would take
    ~180 MiB more)."""
    cap_mb = 48
    big = tmp_path / "big.svm"
    size = _write_big_svmlight(big, 4 * cap_mb * 2**20)
    assert size >= 4 * cap_mb * 2**20
    small = tmp_path / "small.svm"
    with open(big, "rb") as f, open(small, "wb") as g:
        head = f.read(size // 8)
        g.write(head[: head.rindex(b"\n") + 1])
    common = [
        "--chunk-mb",
        "4",
        "--row-group-size",
        "8192",
        "--rows-per-file",
        "65536",
        "--quiet",
        "--split",
        "train=0.8,val=0.2",
    ]
    base = _peak_rss_mb(["prep", "svmlight", small, "--out", tmp_path / "s", *common])
    peak = _peak_rss_mb(["prep", "svmlight", big, "--out", tmp_path / "b", *common])
    ds = ShardedDataset(tmp_path / "b")
    rows = ds.n_rows("train") + ds.n_rows("val")
    assert rows > 300_000
    # in-memory CSR of this file (float64 values + int32 indices, as sklearn loads it)
    csr_mb = (rows * 30 * 12) / 2**20
    assert peak - base < cap_mb, (peak, base, csr_mb)
    print(
        f"file {size / 2**20:.0f} MiB, CSR {csr_mb:.0f} MiB, peak RSS {base:.0f} MiB "
        f"for an eighth of it, {peak - base:+.0f} MiB for all of it"
    )
