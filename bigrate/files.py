"""General file helpers, the lowest layer of the package: atomic writes of files and
directories, checksums, JSON conversion of NumPy values and liveness of a process.

Every writer of bigrate (datasets, models, run directories, benchmarks) goes through
these, so that a crash at any moment leaves either the old or the new content in place,
never a torn file or a half-written directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "current_umask",
    "jsonable",
    "pid_alive",
    "replace_dir",
    "sha256_file",
]


def sha256_file(path: str | os.PathLike, bufsize: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(bufsize)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a text file (UTF-8) through a temporary file renamed into place."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, payload: bytes) -> Path:
    """Write a file through a temporary file (fsynced) renamed into place. The file gets
    the permissions a plain ``open(path, "w")`` would give (0666 less the umask)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def current_umask() -> int:
    """The process's umask (read without changing it for longer than a call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def replace_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Move the finished directory ``tmp`` to ``target``, replacing what is there.

    The old directory is first renamed aside (``.<name>.old-<pid>``), then ``tmp`` is
    renamed into place, then the old one removed; if the second rename fails the old one
    is put back. At every moment ``target`` is the complete old or the complete new
    directory (or, for an instant between the two renames, absent)."""
    tmp, target = Path(tmp), Path(target)
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def jsonable(x):
    """``x`` with NumPy scalars and arrays turned into Python numbers and lists (dicts
    get string keys), so that ``json.dumps`` takes it."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def pid_alive(pid: int) -> bool:
    """Is there a process with this pid on this machine (ours or another user's)?"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
