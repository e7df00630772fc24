"""A small, safe expression language for constraints such as ``block_size_x*block_size_y<=1024``.

Expressions are parsed with :mod:`ast` and only arithmetic, comparisons, boolean logic, conditional
expressions, names and literals are allowed; nothing is ever passed to ``eval``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from fleet.errors import SpecError


class Undefined(Exception):
    """The expression has no value for these values: a zero divisor, an overflow, a huge power."""


MAX_EXPONENT = 64


def _power(base: Any, exponent: Any) -> Any:
    # Unbounded powers hang inside one C call that no timeout interrupts.
    if isinstance(exponent, int | float) and abs(exponent) > MAX_EXPONENT:
        raise Undefined(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    return operator.pow(base, exponent)


def _multiply(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):
        raise Undefined("strings cannot be multiplied")
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
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as error:
            raise SpecError(f"constraint {text!r} is not an expression: {error.msg}") from None
        self._check(tree.body)
        self._tree = tree.body
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
        for child in ast.walk(node):
            if not isinstance(child, allowed):
                raise SpecError(f"constraint {self.text!r}: {type(child).__name__} is not allowed")
            if isinstance(child, ast.Call) and not (
                isinstance(child.func, ast.Name) and child.func.id in _FUNCTIONS and not child.keywords
            ):
                raise SpecError(f"constraint {self.text!r}: only min(), max() and abs() may be called")
            if isinstance(child, ast.Constant) and not isinstance(child.value, bool | int | float | str):
                raise SpecError(f"constraint {self.text!r}: {child.value!r} is not a number, bool or string")

    def __call__(self, values: Mapping[str, Any]) -> Any:
        return _evaluate(self._tree, values, self.text)

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"


def _evaluate(node: ast.AST, values: Mapping[str, Any], text: str) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            try:
                return values[name]
            except KeyError:
                raise SpecError(f"constraint {text!r} names {name!r}, which is not a knob") from None
        case ast.Tuple(elts=items) | ast.List(elts=items):
            return tuple(_evaluate(item, values, text) for item in items)
        case ast.UnaryOp(op=op, operand=operand):
            return _UNARY[type(op)](_evaluate(operand, values, text))
        case ast.BinOp(left=left, op=op, right=right):
            try:
                return _BINARY[type(op)](_evaluate(left, values, text), _evaluate(right, values, text))
            except (ZeroDivisionError, OverflowError):
                # A zero divisor makes the configuration meaningless rather than the spec wrong.
                raise Undefined(text) from None
        case ast.BoolOp(op=ast.And(), values=items):
            return all(_evaluate(item, values, text) for item in items)
        case ast.BoolOp(op=ast.Or(), values=items):
            return any(_evaluate(item, values, text) for item in items)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            current = _evaluate(left, values, text)
            for op, comparator in zip(ops, comparators, strict=True):
                right = _evaluate(comparator, values, text)
                if not _COMPARE[type(op)](current, right):
                    return False
                current = right
            return True
        case ast.IfExp(test=test, body=body, orelse=orelse):
            return _evaluate(body if _evaluate(test, values, text) else orelse, values, text)
        case ast.Call(func=ast.Name(id=name), args=args):
            return _FUNCTIONS[name](*(_evaluate(arg, values, text) for arg in args))
    raise SpecError(f"constraint {text!r}: cannot evaluate {ast.dump(node)}")
