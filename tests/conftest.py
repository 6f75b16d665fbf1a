import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _pin_blas_kernels():
    """OpenBLAS's SkylakeX kernels in every test process wherever the CPU has
    AVX-512, set before numpy loads OpenBLAS (its worker and command-line
    subprocesses inherit it). The BPSP tests that meet a rounding case on purpose
    (regions that overlap by a sliver, corrections that cycle, the recorded
    partitions) were recorded with them; with the Haswell kernels (which this
    workplace's Zen 5 machines set in OPENBLAS_CORETYPE) sums round otherwise and
    those cases are not met. Results are as exact either way: this pins which
    rounding the tests see, not what users get."""
    if "numpy" in sys.modules:
        return
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512cd"} <= set(flags):
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"


_pin_blas_kernels()

import numpy as np  # noqa: E402  (after the BLAS kernels are pinned)
import psutil  # noqa: E402
import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    from bigrate.data.prep import find_shared_data

    return find_shared_data()


@pytest.fixture(params=[0, 7], ids=["seed0", "seed7"])
def seed(request) -> int:
    return request.param


def run_cli(
    *args, check=False, timeout=600, env=None, **kw
) -> subprocess.CompletedProcess:
    """Run the real `bigrate` command in a subprocess (``env``: its environment,
    default this one's)."""
    env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [sys.executable, "-m", "bigrate.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"bigrate {args} failed ({p.returncode}):\n{p.stderr}")
    return p


def write_svmlight_text(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows))
    return path


def random_svmlight(
    path: Path, n: int, d: int, seed: int = 0, labels=(-1, 1), p_empty: float = 0.05
) -> Path:
    """A random one-based svmlight file with empty rows, comments and the max index."""
    rng = np.random.default_rng(seed)
    lines = ["# a comment line", ""]
    for i in range(n):
        lab = labels[rng.integers(len(labels))]
        if rng.random() < p_empty:
            lines.append(f"{lab}")
            continue
        k = int(rng.integers(1, min(d, 12) + 1))
        idx = np.sort(rng.choice(np.arange(1, d + 1), size=k, replace=False))
        if i == n // 2:
            idx = np.unique(np.append(idx, d))  # the maximum feature index
        vals = rng.standard_normal(len(idx)) * 10.0 ** rng.integers(-3, 4)
        toks = " ".join(f"{j}:{v:.7g}" for j, v in zip(idx, vals))
        tail = "  # trailing comment" if i % 17 == 0 else ""
        lines.append(f"{lab} {toks}{tail}")
    return write_svmlight_text(path, lines)


def default_sigint() -> None:
    """Child pre-exec hook: SIGINT back to its default action. A test run started in the
    background by a non-interactive shell inherits SIGINT *ignored*, and Python then
    installs no KeyboardInterrupt handler, so Ctrl-C tests would see it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_cli(*args, **kw) -> subprocess.Popen:
    """Start the real `bigrate` command in the background (stdout/stderr piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bigrate.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_sigint,
        **kw,
    )


def wait_for_results(runs: Path, pattern: str, n: int, proc=None, timeout: float = 120):
    """The first run directory under ``runs`` matching ``pattern`` once it holds at least
    ``n`` finished task results; fails if ``proc`` exits first or time runs out."""
    import time

    t0 = time.time()
    while time.time() - t0 < timeout:
        dirs = sorted(runs.glob(pattern)) if runs.exists() else []
        if dirs and len(list((dirs[0] / "results").glob("*.json"))) >= n:
            return dirs[0]
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the job exited first: {proc.stderr.read().decode()}")
        time.sleep(0.02)
    raise AssertionError(f"no run under {runs} reached {n} results in {timeout}s")


def descendants(pid: int) -> list:
    """The processes below ``pid`` (which this test started): the only victims."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_a_fitting_worker(runs: Path, ancestor: int, proc, timeout: float = 180):
    """Kill, by its process id, the worker that wrote the first task record (each
    record names its process; the queue still holds tasks, so that worker is fitting
    the next one), once it is checked to be a descendant of ``ancestor`` (a process
    this test started). Returns the id, or None if no record came in time."""
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        for f in runs.glob("*/results/*.json"):
            pid = json.loads(f.read_text()).get("pid")
            if pid in {p.pid for p in descendants(ancestor)}:
                os.kill(pid, signal.SIGKILL)
                return pid
        time.sleep(0.01)
    return None


@pytest.fixture(scope="module")
def short_tmp():
    """A directory with a short path for a Ray runtime's temp dir (its socket paths must
    stay under 108 bytes, which pytest's per-test directories, under xdist more so, can
    exceed); removed afterwards."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="bgr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def compiled_kernels(tmp_path_factory):
    """Every estimator's kernels in numba's on-disk cache before a test starts
    processes that use them (CLI jobs, Dask and Ray workers): on a fresh clone each
    such process would otherwise compile the same kernels at the same time (minutes of
    CPU each for the SVC, path and BPSP learners). Done once per test run, under a lock
    the xdist processes share: the second finds the cache filled."""
    import fcntl

    from bigrate.runner.warm import warm

    lock = tmp_path_factory.getbasetemp().parent / "compiled-kernels.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            rows = warm()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    assert not [r for r in rows if r["error"]], rows
