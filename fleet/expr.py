"""A small, safe expression language for constraints such as ``block_size_x*block_size_y<=1024``.

Expressions are parsed with :mod:`ast` and only arithmetic, comparisons, boolean logic, conditional
expressions, names and literals are allowed; nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from fleet.errors import SpecError, did_you_mean, shown


class Undefined(Exception):
    """The expression has no value for these values: a zero divisor, an overflow, a string multiplied."""


class TooCostly(Undefined):
    """Evaluating the expression for these values would pass the cost bound (see :data:`MAX_BITS` and the rest).

    A configuration it happens for is invalid, so that no search ever hangs on one; a spec whose constraints
    pass the bound on a sampled configuration is refused when it is loaded
    (:meth:`fleet.space.Space.check_constraints`).
    """


class IllTyped(Undefined):
    """The expression combines values that do not go together, such as a string compared with a number."""


# The cost bound. A constraint is a test of knob values, not a computation: each of these is far above
# what one needs, and low enough that no evaluation takes more than a few milliseconds.
MAX_LENGTH = 4096
"""Characters of one expression's source."""
MAX_DEPTH = 100
"""Nesting of one expression's tree: the evaluator recurses once per level."""
MAX_BITS = 4096
"""Bits of an integer value, intermediate ones included (``2**4096`` has 4097): a power tower stops here."""
MAX_ITEMS = 4096
"""Items of a tuple or characters of a string that an operation makes (``(1,) * n``, ``s + s``)."""
MAX_STEPS = 10_000
"""Work of one evaluation: nodes visited plus items of the sequences made, compared or searched."""


class _Budget:
    """The steps one evaluation has left."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_STEPS

    def spend(self, steps: int) -> None:
        self.left -= steps
        if self.left < 0:
            raise TooCostly(f"it takes more than {MAX_STEPS} steps")


def _bits(value: Any) -> int:
    return value.bit_length() if isinstance(value, int) else 0


def _checked(value: Any) -> Any:
    """``value`` if it is within the bound on sizes, else :class:`TooCostly`."""
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise TooCostly(f"an intermediate integer has more than {MAX_BITS} bits")
    if isinstance(value, str | tuple) and len(value) > MAX_ITEMS:
        raise TooCostly(f"an intermediate {type(value).__name__} has more than {MAX_ITEMS} items")
    if isinstance(value, complex):
        # A fractional power of a negative number: no real value, like a zero divisor.
        raise Undefined("a complex number")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # An integer power is computed in one C call that no timeout interrupts, so its size is bounded before it
    # starts: (bits - 1) * exponent is a lower bound of the result's bits. Each power of a tower is checked, and
    # each result too, so the bound holds for the whole tower, not only for each exponent alone.
    ints = isinstance(base, int) and isinstance(exponent, int)
    if ints and exponent > 0 and abs(base) > 1 and (base.bit_length() - 1) * exponent >= MAX_BITS:
        raise TooCostly(f"a power has more than {MAX_BITS} bits")
    return operator.pow(base, exponent)


def _multiply(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):
        raise Undefined("strings cannot be multiplied")
    if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_BITS + 1:
        raise TooCostly(f"a product has more than {MAX_BITS} bits")
    for sequence, count in ((a, b), (b, a)):
        # (1,) * 2**40 would fill the memory before any check of its result.
        if isinstance(sequence, tuple) and isinstance(count, int) and len(sequence) * max(count, 0) > MAX_ITEMS:
            raise TooCostly(f"a repeated tuple has more than {MAX_ITEMS} items")
    return operator.mul(a, b)


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _multiply,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


class Expression:
    """A parsed expression over named values.

    Parameters
    ----------
    text:
        The source, e.g. ``"tile_i * tile_j <= 4096 and unroll in (1, 2, 4)"``.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        if not isinstance(text, str):
            raise SpecError(f"a constraint is a string, not {type(text).__name__}")
        if len(text) > MAX_LENGTH:
            raise SpecError(f"constraint {shown(text)} is longer than {MAX_LENGTH} characters")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as error:
            raise SpecError(f"constraint {shown(text)} is not an expression: {error.msg}") from None
        except (ValueError, RecursionError, MemoryError):
            # Python's parser gives up on deep nesting (50 000 unary minus signs) with these, not SyntaxError.
            raise SpecError(f"constraint {shown(text)} is nested too deeply") from None
        self._check(tree.body)
        self._evaluate = _compile(tree.body, text)
        self.names = frozenset(
            node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id not in _FUNCTIONS
        )

    def _check(self, node: ast.AST) -> None:
        allowed = (
            ast.BinOp,
            ast.UnaryOp,
            ast.BoolOp,
            ast.Compare,
            ast.IfExp,
            ast.Name,
            ast.Constant,
            ast.Tuple,
            ast.List,
            ast.Load,
            ast.And,
            ast.Or,
            ast.Call,
            *_BINARY,
            *_UNARY,
            *_COMPARE,
        )
        depths = [(node, 1)]
        while depths:
            child, depth = depths.pop()
            if depth > MAX_DEPTH:
                raise SpecError(f"constraint {shown(self.text)} is nested more than {MAX_DEPTH} deep")
            depths.extend((grandchild, depth + 1) for grandchild in ast.iter_child_nodes(child))
            if not isinstance(child, allowed):
                raise SpecError(f"constraint {shown(self.text)}: {type(child).__name__} is not allowed")
            if isinstance(child, ast.Call) and not (
                isinstance(child.func, ast.Name) and child.func.id in _FUNCTIONS and not child.keywords
            ):
                raise SpecError(f"constraint {shown(self.text)}: only min(), max() and abs() may be called")
            if isinstance(child, ast.Constant) and not isinstance(child.value, bool | int | float | str):
                raise SpecError(f"constraint {shown(self.text)}: {shown(child.value)} is not a number, bool or string")
            if isinstance(child, ast.Constant) and _bits(child.value) > MAX_BITS:
                raise SpecError(f"constraint {shown(self.text)}: a number has more than {MAX_BITS} bits")

    def __call__(self, values: Mapping[str, Any]) -> Any:
        """The expression's value for ``values``.

        Raises :class:`Undefined` (or its :class:`TooCostly` or :class:`IllTyped`) where it has none, and
        :class:`SpecError` for a name that ``values`` lacks.
        """
        return self.measure(values)[0]

    def measure(self, values: Mapping[str, Any]) -> tuple[Any, int]:
        """The expression's value for ``values`` and the steps it took (at most :data:`MAX_STEPS`)."""
        budget = _Budget()
        value = self._evaluate(values, budget)
        return value, MAX_STEPS - budget.left

    def __reduce__(self) -> tuple[type[Expression], tuple[str]]:
        # Its compiled form is nested functions, which pickle cannot take: a copy (a space sent to another
        # process) is compiled again from the source.
        return Expression, (self.text,)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


_Node = Callable[[Mapping[str, Any], _Budget], Any]
"""A node of an expression's tree, made a function of the values and the evaluation's budget."""


def _compile(node: ast.AST, text: str) -> _Node:
    """``node`` (of a checked tree) as a function: it evaluates as a walk of the tree would, spending one step on
    entering each node, without finding out the node's kind at every evaluation (constraints are evaluated on
    every configuration of a space, a hundred thousand of them in a grid's first pass)."""
    compiler = _COMPILERS.get(type(node))
    if compiler is None:
        raise SpecError(f"constraint {shown(text)}: cannot evaluate {type(node).__name__}")
    return compiler(node, text)


def _constant(node: ast.Constant, text: str) -> _Node:
    value = node.value

    def constant(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return value

    return constant


def _name(node: ast.Name, text: str) -> _Node:
    name = node.id

    def lookup(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        try:
            return values[name]
        except KeyError:
            hint = did_you_mean(name, values)
            raise SpecError(f"constraint {shown(text)} names {name!r}, which is not a knob{hint}") from None

    return lookup


def _sequence(node: ast.Tuple | ast.List, text: str) -> _Node:
    parts = [_compile(item, text) for item in node.elts]

    def sequence(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return tuple(part(values, budget) for part in parts)

    return sequence


def _unary(node: ast.UnaryOp, text: str) -> _Node:
    unary, operand = _UNARY[type(node.op)], _compile(node.operand, text)

    def apply_unary(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return _apply(unary, budget, operand(values, budget))

    return apply_unary


def _binary(node: ast.BinOp, text: str) -> _Node:
    binary, left, right = _BINARY[type(node.op)], _compile(node.left, text), _compile(node.right, text)

    def apply_binary(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        left_value = left(values, budget)
        return _apply(binary, budget, left_value, right(values, budget))

    return apply_binary


def _boolean(node: ast.BoolOp, text: str) -> _Node:
    parts = [_compile(item, text) for item in node.values]
    short_circuit = all if isinstance(node.op, ast.And) else any  # a bool, not the deciding operand's value

    def boolean(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return short_circuit(part(values, budget) for part in parts)

    return boolean


def _compare(node: ast.Compare, text: str) -> _Node:
    first = _compile(node.left, text)
    rest = [(_COMPARE[type(op)], _compile(item, text)) for op, item in zip(node.ops, node.comparators, strict=True)]

    def compare(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        current = first(values, budget)
        for comparison, part in rest:
            right = part(values, budget)
            if not _apply(comparison, budget, current, right):
                return False
            current = right
        return True

    return compare


def _choose(node: ast.IfExp, text: str) -> _Node:
    condition, then, otherwise = _compile(node.test, text), _compile(node.body, text), _compile(node.orelse, text)

    def choose(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return (then if condition(values, budget) else otherwise)(values, budget)

    return choose


def _call(node: ast.Call, text: str) -> _Node:
    assert isinstance(node.func, ast.Name)  # Expression._check allows no other call
    function, parts = _FUNCTIONS[node.func.id], [_compile(arg, text) for arg in node.args]

    def call(values: Mapping[str, Any], budget: _Budget) -> Any:
        budget.spend(1)
        return _apply(function, budget, *(part(values, budget) for part in parts))

    return call


_COMPILERS: dict[type, Callable[[Any, str], _Node]] = {
    ast.Constant: _constant,
    ast.Name: _name,
    ast.Tuple: _sequence,
    ast.List: _sequence,
    ast.UnaryOp: _unary,
    ast.BinOp: _binary,
    ast.BoolOp: _boolean,
    ast.Compare: _compare,
    ast.IfExp: _choose,
    ast.Call: _call,
}


def _apply(function: Callable[..., Any], budget: _Budget, *arguments: Any) -> Any:
    """``function(*arguments)`` within the cost bound, its failures turned into :class:`Undefined`."""
    # Comparing, searching and taking the min of sequences costs their length.
    cost = 0
    for argument in arguments:
        if isinstance(argument, str | tuple):
            cost += len(argument)
    if cost:
        budget.spend(cost)
    try:
        result = _checked(function(*arguments))
    except (ZeroDivisionError, OverflowError):
        # A zero divisor makes the configuration meaningless rather than the spec wrong.
        raise Undefined("a zero divisor or an overflow") from None
    except (TypeError, ValueError) as error:
        # Such as 1 < "a", or min() of nothing: like a zero divisor, the values are wrong, not the spec (a knob
        # of strings and numbers may be constrained by a test meant for its numbers).
        raise IllTyped(str(error)) from None
    if isinstance(result, str | tuple):
        budget.spend(len(result))
    return result
