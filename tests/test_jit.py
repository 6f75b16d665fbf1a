"""bigrate's ``njit``: a kernel called by another kernel with literal arguments is
compiled once per argument type, not once per literal value (each version is a full
compile, the cost a cold worker pays: issue 47); and ``borrowed`` arrays, which
numba passes from kernel to kernel without reference counts."""

import importlib
import pkgutil

import numba
import numpy as np
import pytest
from numba.core import types
from numba.extending import intrinsic

import bigrate
from bigrate._jit import KernelDispatcher, borrowed, keep_alive, njit


def _pair(jit):
    @jit
    def callee(i, flag, out):
        out[0] += i if flag else -i
        return out[0]

    @jit
    def caller(out):
        i = -1
        callee(i, True, out)
        callee(3, False, out)
        callee(-1, False, out)
        return callee(out.shape[0], True, out)

    return callee, caller


def test_literal_arguments_from_a_kernel_compile_one_version():
    callee, caller = _pair(njit)
    out = np.zeros(1, np.int64)
    assert caller(out) == -1 - 3 + 1 + 1
    assert len(callee.signatures) == 1
    assert [str(t) for t in callee.signatures[0]] == [
        "int64",
        "bool",
        "array(int64, 1d, C)",
    ]
    # the same result as numba's own njit, which compiles a version per literal
    plain_callee, plain_caller = _pair(numba.njit)
    out2 = np.zeros(1, np.int64)
    assert plain_caller(out2) == -2 and out2[0] == out[0]
    assert len(plain_callee.signatures) > 1


def test_every_kernel_of_the_package_uses_the_one_version_dispatcher():
    plain = []
    for m in pkgutil.walk_packages(bigrate.__path__, "bigrate."):
        if m.name.endswith(("_kernels", "cholesky", "least_squares", "dual_cd", "cg",
                            "sparse_rows", "duplicate_rows")):  # fmt: skip
            mod = importlib.import_module(m.name)
            for name, f in vars(mod).items():
                if isinstance(f, numba.core.registry.CPUDispatcher):
                    if f.__module__ == mod.__name__ and not isinstance(
                        f, KernelDispatcher
                    ):
                        plain.append(f"{m.name}.{name}")
    assert not plain, plain


# the start of a script run in a fresh process: every function numba compiles from
# then on is listed in ``names``
_LISTEN = r"""
import json
from numba.core import event

names = []


class Listener(event.Listener):
    def on_start(self, ev):
        names.append(ev.data["dispatcher"].py_func.__qualname__)

    def on_end(self, ev):
        pass


event.register("numba:compile", Listener())
"""

# ... while an AUMLinearClassifier is fitted (in a process with an empty cache)
_COLD_FIT = (
    _LISTEN
    + r"""
import numpy as np
from bigrate import AUMLinearClassifier

rng = np.random.default_rng(0)
X = rng.normal(size=(200, 5))
y = np.where(X[:, 0] + rng.normal(size=200) > 0, 1, -1)
AUMLinearClassifier().fit(X, y)
print(json.dumps(names))
"""
)


def test_a_cold_aum_fit_does_not_compile_numba_s_slice_shape_error(tmp_path):
    """A slice assigned from an array makes numba compile its shape-mismatch error
    message, most of a cold AUM fit (see bigrate._jit); its kernels copy with loops."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-c", _COLD_FIT], capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    names = json.loads(p.stdout.strip().splitlines()[-1])
    assert any("line_search" in n for n in names), names  # compiled here, cold
    assert not [n for n in names if "shape_context" in n], names


def test_an_internal_kernel_runs_from_kernels_and_refuses_python_in_one_line():
    @njit(internal=True)
    def twice(x):
        return 2 * x

    @njit
    def caller(x):
        return twice(x) + 1

    assert caller(3) == 7
    (cres,) = twice.overloads.values()
    # compiled without the wrapper that lets Python call it (the compile time saved)
    wrapper = cres.fndesc.llvm_cpython_wrapper_name
    assert cres.library.get_pointer_to_function(wrapper) == 0
    assert caller.overloads[caller.signatures[0]].library.get_pointer_to_function(
        caller.overloads[caller.signatures[0]].fndesc.llvm_cpython_wrapper_name
    )
    try:
        twice(3)
    except TypeError as e:
        assert "twice is an internal kernel" in str(e) and "\n" not in str(e)
    else:
        raise AssertionError("an internal kernel called from Python did not refuse")
    assert twice.py_func(3) == 6


# ... while RowSequences are made, joined and stepped over as a cluster worker's first
# round does (run twice with one cache)
_ROUND_LISTS = (
    _LISTEN
    + r"""
from bigrate.data.format import RowSequence
from bigrate.linear.distributed import _tiny_block, warm_steps
from bigrate.linear.steps import KernelConfig

a = RowSequence([_tiny_block(), _tiny_block()])
RowSequence.joined([a, RowSequence([_tiny_block()])])
for mode in ("balanced", "pairs"):
    warm_steps(KernelConfig(mode, 1.0, 1.0, 1e-4, 0.1, 0.01, 0.05, 1.0, 0, 0.01))
print(json.dumps(names))
"""
)


def test_a_worker_s_row_sequences_compile_nothing_once_cached(tmp_path):
    """The typed lists a RowSequence hands the step kernels are made by cached
    kernels: numba's typed list methods called from Python compile on first use in
    every process (2.5 s of a fresh worker's first round), the cached ones do not."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _ROUND_LISTS], capture_output=True,
                           text=True, env=env, timeout=600)  # fmt: skip
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert "np_sgd_steps_seq" in runs[0], runs[0]  # compiled cold here
    assert runs[1] == [], runs[1]


# ... while a CostSensitiveSVC (RBF) is fitted (in a process with an empty cache)
_COLD_SVC = (
    _LISTEN
    + r"""
import numpy as np
from bigrate import CostSensitiveSVC

rng = np.random.default_rng(0)
X = rng.normal(size=(200, 5))
CostSensitiveSVC().fit(X, np.where(X[:, 0] > 0, 1, -1))
print(json.dumps(names))
"""
)


def test_a_cold_svc_fit_compiles_the_solver_and_none_of_numpy_s_allocations(tmp_path):
    """The SMO's first fit in a fresh process compiles its solver's kernels only: its
    work arrays come from the caller (numpy's allocation routines compiled for each
    dtype were ~0.9 s of a cold fit), the RBF kernel's diagonal is 1 without a
    compiled loop, and the warm start's gradient update is part of the solve (an
    entry of its own cost ~0.5 s)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.run([sys.executable, "-c", _COLD_SVC], capture_output=True,
                       text=True, env=env, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    names = json.loads(p.stdout.strip().splitlines()[-1])
    assert "smo_solve" in names, names  # compiled here, cold
    numpy_impl = [n for n in names if n.startswith(("ol_np", "np_", "_ol_array"))]
    assert not numpy_impl, names
    assert not {"gradient_update", "diag_kernel"} & set(names), names


@intrinsic
def _owner(typingctx, arr):
    """The address of an array's meminfo (its reference count's owner), 0 for none."""

    def codegen(context, builder, sig, args):
        ary = context.make_array(arr)(context, builder, value=args[0])
        return builder.ptrtoint(ary.meminfo, context.get_value_type(types.intp))

    return types.intp(arr), codegen


@njit
def _sum_rows(a, ws):
    x, k = ws
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * x[i] + k[i]
    return s, x[1:], _owner(x[1:])


@njit
def _borrowing_kernel(a, n):
    """Work arrays of its own, borrowed and kept to the end, passed down n times
    with allocations in between (memory freed too early would be reused)."""
    own = (np.arange(a.shape[0]) * 0.5, np.arange(a.shape[0]))
    ws = borrowed(own)
    a = borrowed(a)
    total = 0.0
    junk = 0.0
    owners = _owner(a) + _owner(ws[0]) + _owner(ws[1])
    for _ in range(n):
        s, view, view_owner = _sum_rows(a, ws)
        owners += view_owner
        tmp = np.full(a.shape[0] * 4, 7.0)  # reuses freed memory, were there any
        junk += tmp[0]
        total += s + view[0]
    keep_alive(own)
    return total, owners, junk, _owner(own[0])


def test_borrowed_arrays_read_the_same_data_without_a_reference_count():
    """bigrate._jit.borrowed: an array (or a tuple of them) with its meminfo NULL,
    so numba's reference counts on it and on its views are no-ops (no atomic add):
    the same values through every call, no owner on it or on a view of it, while
    the arrays it came from keep theirs."""
    a = np.linspace(1.0, 2.0, 50)
    total, owners, junk, own_owner = _borrowing_kernel(a, 200)
    x = np.arange(50) * 0.5
    s = 0.0
    for i in range(50):  # the kernel's sum, in its order (numpy's sums pairwise)
        s += a[i] * x[i] + i
    want = 0.0
    for _ in range(200):
        want += s + x[1]
    assert total == want
    assert owners == 0 and junk == 7.0 * 200
    assert own_owner != 0


def test_borrowed_refuses_what_is_not_an_array():
    @njit
    def bad(x):
        return borrowed(x)

    with pytest.raises(numba.core.errors.TypingError):
        bad(1.0)
