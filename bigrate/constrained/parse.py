"""Constraints and objectives written as text, as job files hold them: parsed, never
evaluated. The text is read by Python's parser and only these forms are accepted::

    recall() >= 0.6
    positive_rate(group="Female") >= 0.8 * positive_rate(group="Male")
    churn(baseline="runs/a9a-np-LATEST/model") <= 0.03
    coverage() + 0.5 * error_rate(group="B") <= 0.4
    demographic_parity("Female", "Male", 0.8)
    error_rate()                                   (an objective)

that is: calls of the vocabulary's functions (:mod:`bigrate.constrained.vocabulary`)
with literal arguments (strings, numbers, booleans), numbers, ``+``, ``-``, ``*`` by
a number, parentheses, and one ``<=`` or ``>=``. A ``baseline=`` (churn) names a saved
model (``runs/NAME-LATEST/model`` for the newest complete run of a job), loaded by the
caller's ``load_baseline``. Everything else is refused with what was found.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from numbers import Real

from bigrate.constrained import vocabulary as V

#: the names a text may call: the vocabulary's rates and constraints
FUNCTIONS = {
    name: getattr(V, name)
    for name in V.__all__
    if name not in ("Constraint", "Expr", "Subset")
}
#: keyword arguments a text may give (``mask`` needs an array: not in text)
KEYWORDS = {"group", "dataset", "label", "baseline", "kappa", "max_error"}


@dataclass(frozen=True, eq=False)
class Parsed:
    """A constraint as written: ``text``, its two sides (an :class:`~V.Expr` or a
    number each) and ``op`` ("<=" or ">="), and the :class:`~V.Constraint` they make
    (``lhs`` is that constraint's expression and ``op`` None for the vocabulary's
    ready-made constraints, such as ``demographic_parity``)."""

    text: str
    lhs: object
    op: str | None
    rhs: object
    constraint: V.Constraint


def parse_constraint(text: str, load_baseline=None) -> Parsed:
    """Parse a constraint (``lhs <= rhs``, ``lhs >= rhs`` or a ready-made one);
    ValueError says what is wrong."""
    tree = _tree(text)
    if isinstance(tree, ast.Compare):
        if len(tree.ops) != 1 or not isinstance(tree.ops[0], (ast.LtE, ast.GtE)):
            raise ValueError(f"{text!r}: compare two sides with one <= or >=")
        op = "<=" if isinstance(tree.ops[0], ast.LtE) else ">="
        b = _Builder(text, load_baseline)
        lhs, rhs = b.build(tree.left), b.build(tree.comparators[0])
        if not isinstance(lhs, V.Expr) and not isinstance(rhs, V.Expr):
            raise ValueError(f"{text!r}: compares two numbers; one side needs a rate")
        try:  # a number on the left is reflected onto the rate's side
            c = (lhs <= rhs) if op == "<=" else (lhs >= rhs)
        except ValueError as e:
            raise ValueError(f"{text!r}: {e}") from None
        return Parsed(text, lhs, op, rhs, V.Constraint(c.expr, text))
    built = _Builder(text, load_baseline).build(tree)
    if not isinstance(built, V.Constraint):
        raise ValueError(
            f"{text!r}: not a constraint; compare a rate with <= or >= (e.g. "
            "'recall() >= 0.6')"
        )
    return Parsed(text, built.expr, None, 0.0, V.Constraint(built.expr, text))


def parse_expression(text: str, load_baseline=None) -> V.Expr:
    """Parse an objective: a linear expression of rates (no comparison)."""
    tree = _tree(text)
    built = (
        None
        if isinstance(tree, ast.Compare)
        else _Builder(text, load_baseline).build(tree)
    )
    if not isinstance(built, V.Expr):
        raise ValueError(f"{text!r}: an objective must be an expression of rates")
    return built


def _tree(text: str) -> ast.AST:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected the text of a constraint, got {text!r}")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"{text!r}: not an expression ({e.msg})") from None


class _Builder:
    def __init__(self, text: str, load_baseline):
        self.text, self.load_baseline = text, load_baseline

    def fail(self, what: str):
        raise ValueError(f"{self.text!r}: {what}")

    def build(self, node):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, Real) and not isinstance(node.value, bool):
                return float(node.value)
            self.fail(f"{node.value!r} is not a number")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.build(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(
            node.op, (ast.Add, ast.Sub, ast.Mult)
        ):
            a, b = self.build(node.left), self.build(node.right)
            if isinstance(a, V.Constraint) or isinstance(b, V.Constraint):
                self.fail("a constraint cannot be part of an expression")
            if isinstance(node.op, ast.Mult):
                if isinstance(a, V.Expr) and isinstance(b, V.Expr):
                    self.fail("rates can only be multiplied by numbers")
                return a * b
            return a + b if isinstance(node.op, ast.Add) else a - b
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Compare):
            self.fail("only one comparison, at the top")
        self.fail(f"{ast.unparse(node)!r} is not allowed (rates, numbers, + - *)")

    def call(self, node: ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = ast.unparse(node.func)
            self.fail(f"unknown rate {name!r} (known: {', '.join(sorted(FUNCTIONS))})")
        args = [self.literal(a) for a in node.args]
        kw = {}
        for k in node.keywords:
            if k.arg not in KEYWORDS:
                self.fail(
                    f"{node.func.id}() takes no argument {k.arg!r} here (known: "
                    f"{', '.join(sorted(KEYWORDS))})"
                )
            kw[k.arg] = self.literal(k.value)
        if "baseline" in kw:
            if not isinstance(kw["baseline"], str):
                self.fail("baseline= names a saved model directory, as a string")
            if self.load_baseline is None:
                self.fail("a baseline model cannot be loaded here")
            kw["baseline"] = self.load_baseline(kw["baseline"])
        try:
            return FUNCTIONS[node.func.id](*args, **kw)
        except (TypeError, ValueError) as e:
            self.fail(f"{node.func.id}(): {e}")

    def literal(self, node):
        if isinstance(node, ast.Constant) and isinstance(
            node.value, (str, int, float, bool)
        ):
            return node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, Real)
        ):
            return -node.operand.value
        self.fail(f"arguments must be strings or numbers, got {ast.unparse(node)!r}")
