"""``njit`` for bigrate's kernels: numba's, with one compiled version per argument
*type* when one kernel calls another.

numba compiles a separate version of a jitted function for every literal value a
jitted caller passes (``_row(i, kp, cols, m, True, stats)`` and ``False`` are two
versions, ``i = -1`` before a loop a third), and each version costs a full compile:
on a machine with an empty cache that was most of a first fit's time (issue 47: 6
versions of the SMO's column filler, 4 of its row fetch). Here a call from jitted
code is typed with the literals widened to their plain types, so the version a
Python call compiles serves every caller. No kernel of ours dispatches on a literal
argument's value at compile time (``numba.literally`` is not used), so the code is
the same; only the count of versions changes.

Kernels copy arrays into slices with loops, not ``a[:k] = b[:k]``: a slice assigned
from an array makes numba compile its shape-mismatch error message (integer and tuple
formatting, string joins), 1.8-2.7 s on an empty cache, once per array rank in each
process. That was most of a cold AUMLinearClassifier fit (7.0 -> 4.3 s without it).

A kernel only other kernels call is ``njit(internal=True)``: numba compiles it without
the wrappers that let Python call it (the argument unboxing and the C entry), which
are a fifth of the compile time of a small kernel with many arguments (a cold
NeymanPearsonSVC fit 9.5 -> 7.8 s). Called from Python it raises TypeError.
"""

from __future__ import annotations

from numba.core import cgutils, types
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic


class KernelDispatcher(CPUDispatcher):
    """A CPU dispatcher that types calls from jitted code without literal arguments."""

    def get_call_template(self, args, kws):
        args = tuple(types.unliteral(a) for a in args)
        kws = {k: types.unliteral(v) for k, v in kws.items()}
        return super().get_call_template(args, kws)


class InternalKernelDispatcher(KernelDispatcher):
    """A kernel compiled for calls from other kernels only (no Python entry)."""

    def __call__(self, *args, **kws):
        f = self.py_func
        raise TypeError(
            f"{f.__module__}.{f.__qualname__} is an internal kernel (njit(internal="
            f"True)): it is compiled without a Python entry and is called from other "
            f"kernels only; call its py_func to run it as Python"
        )


def njit(func=None, *, cache: bool = False, internal: bool = False, **options):
    """As ``numba.njit(cache=..., nogil=..., inline=..., fastmath=...)``, returning a
    :class:`KernelDispatcher`; ``internal``: an :class:`InternalKernelDispatcher`."""
    if internal:
        options = {**options, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    cls = InternalKernelDispatcher if internal else KernelDispatcher

    def wrap(f):
        disp = cls(
            py_func=f,
            locals={},
            targetoptions={"nopython": True, "boundscheck": None, **options},
        )
        if cache:
            disp.enable_caching()
        return disp

    return wrap(func) if func is not None else wrap


@intrinsic
def borrowed(typingctx, arr):
    """``arr`` (an array, or a tuple of arrays) without its reference count: the
    same data, shape and strides, no owner (meminfo and parent NULL), so the counts
    numba takes and drops on every pass of it to a kernel and every view of it are
    a test of NULL instead of an atomic add (a locked instruction, which drains the
    store buffer). numba counts each array a kernel receives or returns: the BPSP
    walk made ~480 such counts a region.

    Only for an array that something else keeps alive for as long as this one and
    its views are used, and that never leaves the kernel: a caller's argument
    within the call, or a local kept to the end (:func:`keep_alive`). Returned to
    Python it would be an array of freed memory."""
    if isinstance(arr, types.Array):
        members = None
    elif isinstance(arr, types.BaseTuple) and all(
        isinstance(t, types.Array) for t in arr.types
    ):
        members = arr.types
    else:
        return None

    def strip(context, builder, ty, value):
        ary = context.make_array(ty)(context, builder, value=value)
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    def codegen(context, builder, sig, args):
        if members is None:
            return strip(context, builder, arr, args[0])
        out = [strip(context, builder, t, builder.extract_value(args[0], i))
               for i, t in enumerate(members)]  # fmt: skip
        return context.make_tuple(builder, arr, out)

    return arr(arr), codegen


@intrinsic
def keep_alive(typingctx, owner):
    """A use of ``owner`` and nothing else: called at the end of a kernel, it keeps
    the owner of :func:`borrowed` arrays alive to there (numba drops a local's
    reference after its last use)."""

    def codegen(context, builder, sig, args):
        return context.get_dummy_value()

    return types.none(owner), codegen
