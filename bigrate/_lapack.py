"""One LU factorisation for both a solve and an inverse, in compiled code.

``np.linalg.solve`` and ``np.linalg.inv`` in numba each factorise their matrix
(LAPACK's gesv, and getrf then getri): a kernel that needs both of the same matrix
pays for two factorisations. :func:`lu_solve` factorises once (getrf), solves with
the factors (getrs) and leaves them in place, so :func:`lu_inverse` needs only
getri. The calls are the same LAPACK routines numba's own use (scipy's, one
function pointer each), on the same copies in Fortran order, so the results are
those of ``np.linalg.solve`` and ``np.linalg.inv``, bit for bit (with one BLAS
thread, where gesv is getrf then getrs).

numba declares getrf and getri (``numba.np.linalg._LAPACK``) but not getrs: its
entry is registered with LLVM here under a name of our own, and called by that
name from compiled code, so kernels that use it are still cached on disk (a
function pointer held as a constant would not be).
"""

from __future__ import annotations

import numpy as np
from llvmlite import binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic
from numba.np.linalg import _LAPACK, ensure_lapack

from bigrate._jit import njit

ensure_lapack()
_GETRS = "bigrate_lapack_dgetrs"
ll.add_symbol(
    _GETRS, get_cython_function_address("scipy.linalg.cython_lapack", "dgetrs")
)
_getrf = _LAPACK().numba_xxgetrf(types.float64)
_getri = _LAPACK().numba_ez_xxgetri(types.float64)
_KIND = ord("d")


@intrinsic
def _dgetrs(typingctx, lu, ipiv, b):
    """getrs ('N') of the factors ``lu`` (n x n, Fortran order) with pivots
    ``ipiv`` on ``b`` (n x nrhs, Fortran order), in place: LAPACK's info."""
    if not (isinstance(lu, types.Array) and isinstance(b, types.Array)):
        return None
    sig = types.int32(lu, ipiv, b)

    def codegen(context, builder, sig, args):
        i32, f64 = ir.IntType(32), ir.DoubleType()
        a = context.make_array(sig.args[0])(context, builder, args[0])
        p = context.make_array(sig.args[1])(context, builder, args[1])
        x = context.make_array(sig.args[2])(context, builder, args[2])
        n = builder.trunc(cgutils.unpack_tuple(builder, a.shape, 2)[0], i32)
        nrhs = builder.trunc(cgutils.unpack_tuple(builder, x.shape, 2)[1], i32)
        fnty = ir.FunctionType(ir.VoidType(), [
            ir.IntType(8).as_pointer(), i32.as_pointer(), i32.as_pointer(),
            f64.as_pointer(), i32.as_pointer(), i32.as_pointer(), f64.as_pointer(),
            i32.as_pointer(), i32.as_pointer(),
        ])  # fmt: skip
        fn = cgutils.get_or_insert_function(builder.module, fnty, _GETRS)
        trans = cgutils.alloca_once_value(builder, ir.Constant(ir.IntType(8), ord("N")))
        pn = cgutils.alloca_once_value(builder, n)
        pr = cgutils.alloca_once_value(builder, nrhs)
        info = cgutils.alloca_once_value(builder, ir.Constant(i32, 0))
        builder.call(fn, [trans, pn, pr, a.data, pn, p.data, x.data, pn, info])
        return builder.load(info)

    return sig, codegen


@njit(cache=True, nogil=True)
def lu_solve(A, rhs):
    """(ok, x, lu, ipiv): x solves A x = rhs (rhs (n, k)) as ``np.linalg.solve``
    would, ``lu`` and ``ipiv`` A's LU factors for :func:`lu_inverse`. Not ok (x
    zero) where A or rhs is not finite or A is exactly singular, where
    ``np.linalg.solve`` raises."""
    n, k = A.shape[0], rhs.shape[1]
    lu = np.empty((n, n)).T  # Fortran order
    x = np.empty((k, n)).T
    ipiv = np.empty(n, np.int32)
    finite = True
    for j in range(n):
        for i in range(n):
            v = A[i, j]
            finite &= np.isfinite(v)
            lu[i, j] = v
    for i in range(n):
        for t in range(k):
            v = rhs[i, t]
            finite &= np.isfinite(v)
            x[i, t] = v
    ok = finite and (
        n == 0
        or (_getrf(_KIND, n, n, lu.ctypes, n, ipiv.ctypes) == 0
            and _dgetrs(lu, ipiv, x) == 0)
    )  # fmt: skip
    if not ok:
        for i in range(n):
            for t in range(k):
                x[i, t] = 0.0
    return ok, x, lu, ipiv


@njit(cache=True, nogil=True)
def lu_inverse(lu, ipiv):
    """The inverse of the matrix whose LU factors :func:`lu_solve` returned (as
    ``np.linalg.inv`` of it, Fortran order); ``lu`` is overwritten."""
    n = lu.shape[0]
    if n and _getri(_KIND, n, lu.ctypes, n, ipiv.ctypes) != 0:
        raise np.linalg.LinAlgError("Matrix is singular to machine precision.")
    return lu
