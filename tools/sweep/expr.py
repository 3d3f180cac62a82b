"""Expressions of derived keys (`derived:` in grid and space files): arithmetic over other config
keys, parsed with Python's `ast` and evaluated by walking the tree over a fixed set of node types
(no eval of Python code). docs/sweep.md, "Linked parameters".

    2 * cores.aic.count                      a dotted key stands for its value in the point
    max(64, cores.aic.buffers.l1 // 4)       sizes ("512 KiB") are their byte counts
    key("paths.gm->l1.bytes_per_cycle")      a key that is not a Python name
    256 KiB if clock_mhz > 1500 else 128 KiB

Operators: + - * / // % ** (exponent at most 64), comparisons, and/or/not, `a if c else b`;
sizes (64 MiB) and the constants KiB MiB GiB; functions min max abs round int ceil floor log2 key.
"""
import ast
import math
import operator
import re

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
FUNCTIONS = {"min": min, "max": max, "abs": abs, "round": round, "int": int,
             "ceil": math.ceil, "floor": math.floor, "log2": math.log2}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow}
COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}


class ExprError(Exception):
    """A bad expression, or one that cannot be evaluated at a point."""


def _dotted(node):
    """`cores.aic.count` (an Attribute chain over a Name) as its text, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id] + parts[::-1])


class Expr:
    """A parsed expression. `refs`: the config keys it reads."""

    def __init__(self, text, known):
        """`known`: the keys it may read (a key not in it is an error naming the key)."""
        self.text = str(text)
        try:
            # "64 MiB" is 64 * MiB
            src = re.sub(r"([0-9.]+)\s*(KiB|MiB|GiB)\b", r"(\1 * \2)", self.text)
            self.tree = ast.parse(src, mode="eval").body
        except SyntaxError as e:
            raise ExprError(f"'{self.text}': syntax error at column {e.offset}") from None
        self.refs = []
        self._check(self.tree, known)

    def _ref(self, key, known):
        if key not in known:
            raise ExprError(f"'{self.text}': '{key}' is not a swept, fixed or earlier derived key "
                            f"(known: {', '.join(sorted(known)) or 'none'})")
        if key not in self.refs:
            self.refs.append(key)

    def _check(self, n, known):
        if isinstance(n, ast.Constant):
            if isinstance(n.value, bool) or not isinstance(n.value, (int, float, str)):
                raise ExprError(f"'{self.text}': constant {n.value!r} is not a number")
            if isinstance(n.value, str):
                raise ExprError(f"'{self.text}': a text constant ({n.value!r}) is only allowed "
                                "as the argument of key()")
            return
        dotted = _dotted(n)
        if dotted is not None:
            if dotted in UNITS and "." not in dotted:
                return
            self._ref(dotted, known)
            return
        if isinstance(n, ast.Call):
            name = n.func.id if isinstance(n.func, ast.Name) else None
            if n.keywords or (name not in FUNCTIONS and name != "key"):
                raise ExprError(f"'{self.text}': unknown function "
                                f"(allowed: {', '.join(list(FUNCTIONS) + ['key'])})")
            if name == "key":
                if len(n.args) != 1 or not (isinstance(n.args[0], ast.Constant)
                                            and isinstance(n.args[0].value, str)):
                    raise ExprError(f"'{self.text}': key() takes one quoted key")
                self._ref(n.args[0].value, known)
                return
            for a in n.args:
                self._check(a, known)
            return
        children = {ast.BinOp: lambda: (BINARY, n.op, [n.left, n.right]),
                    ast.UnaryOp: lambda: (UNARY, n.op, [n.operand]),
                    ast.BoolOp: lambda: ({ast.And: 0, ast.Or: 0}, n.op, n.values),
                    ast.Compare: lambda: (COMPARE, n.ops[0] if len(n.ops) == 1 else None,
                                          [n.left] + n.comparators),
                    ast.IfExp: lambda: ({None: 0}, None, [n.test, n.body, n.orelse])}
        if type(n) not in children:
            raise ExprError(f"'{self.text}': '{ast.unparse(n)}' is not allowed "
                            "(numbers, keys, arithmetic, comparisons, if/else, functions)")
        table, op, kids = children[type(n)]()
        if (type(op) if op is not None else None) not in table:
            raise ExprError(f"'{self.text}': operator in '{ast.unparse(n)}' is not allowed")
        for k in kids:
            self._check(k, known)

    def evaluate(self, values, node=None):
        """The value at a point (of `node`, a part of the tree; default the whole); `values` maps
        each key in refs to a number."""
        try:
            return self._eval(self.tree if node is None else node, values)
        except ExprError:
            raise
        except (ArithmeticError, ValueError, TypeError, OverflowError) as e:
            raise ExprError(f"'{self.text}': {e}") from None

    def _eval(self, n, v):
        if isinstance(n, ast.Constant):
            return n.value
        dotted = _dotted(n)
        if dotted is not None:
            return UNITS[dotted] if dotted in UNITS else v[dotted]
        if isinstance(n, ast.Call):
            if n.func.id == "key":
                return v[n.args[0].value]
            return FUNCTIONS[n.func.id](*[self._eval(a, v) for a in n.args])
        if isinstance(n, ast.BinOp):
            a, b = self._eval(n.left, v), self._eval(n.right, v)
            if isinstance(n.op, ast.Pow) and abs(b) > 64:
                raise ExprError(f"'{self.text}': exponent {b} is larger than 64")
            return BINARY[type(n.op)](a, b)
        if isinstance(n, ast.UnaryOp):
            return UNARY[type(n.op)](self._eval(n.operand, v))
        if isinstance(n, ast.BoolOp):
            vals = (self._eval(x, v) for x in n.values)
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare):
            return COMPARE[type(n.ops[0])](self._eval(n.left, v), self._eval(n.comparators[0], v))
        return self._eval(n.body, v) if self._eval(n.test, v) else self._eval(n.orelse, v)


def number_text(x):
    """A computed value as the text of a `--set` override: integers without a decimal point."""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**63:
        return str(int(x))
    if isinstance(x, float):
        return f"{x:.10g}"
    return str(x)
