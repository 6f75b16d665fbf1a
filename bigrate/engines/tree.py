"""The reduction tree every engine combines a round's results along: a binary heap
over the tasks (task 0 the root), whose order of combination is fixed by the task
indices, so the combined value is the same bits wherever and in whatever order the
results were computed (in the driver, as engine tasks, or over the workers' own
connections)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["combine_node", "tree_children", "tree_parent", "tree_reduce"]


def tree_children(i: int, n: int) -> list[int]:
    """The children of node ``i`` of the reduction tree over ``n`` tasks: the binary
    heap's ``2i + 1`` and ``2i + 2`` (task 0 is the root; node ``i > 0``'s parent is
    ``(i - 1) // 2``). Every task's result is sent once, to its parent; the tree is
    ``ceil(log2(n + 1))`` levels deep."""
    return [c for c in (2 * i + 1, 2 * i + 2) if c < n]


def tree_parent(i: int) -> int:
    return (i - 1) // 2


def combine_node(combine: Callable, own, *children):
    """Node ``i``'s partial result: its own result combined with its children's
    partials, the lower child first (``combine(combine(own, c1), c2)``)."""
    out = own
    for c in children:
        out = combine(out, c)
    return out


def tree_reduce(values: Sequence, combine: Callable):
    """``values`` combined along the reduction tree (:func:`tree_children`), in the
    order every engine uses on its workers, so the result is the same bits wherever
    and in whatever order the values were computed."""
    n = len(values)
    if n == 0:
        raise ValueError("tree_reduce needs at least one value")
    part = list(values)
    for i in range(n - 1, -1, -1):
        part[i] = combine_node(
            combine, part[i], *(part[c] for c in tree_children(i, n))
        )
    return part[0]
