"""Turning a task's tests into two steps that a completion cannot tamper with.

1. In the completion's process, the harness only *calls* the function on the test inputs and prints the
   results as plain data (see harness.py). The tests and their expected values never enter that process.
2. In the grader, the test code runs on the decoded results: every call ``f(<literals>)`` in it is
   replaced by the result recorded for that call site, and every ``assert`` counts a pass or a failure
   instead of stopping, so partial credit can be the fraction of assertions that held.

That requires each call of the function under test to have literal arguments; :func:`plan` checks it when
tasks are loaded, so an unsupported test is a load-time error, never a silent 0.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

RESULT = "_nodus_result"
RECORD = "_nodus_record"
FAILED = "_nodus_failed"


class UnsupportedTests(ValueError):
    """Tests the two-step harness cannot run; the message says which construct."""


@dataclass(frozen=True)
class Plan:
    calls: list[str]  # the argument tuple of each call site, as Python literal source
    code: str  # the test code with call sites replaced and asserts counted


def _mentions(node: ast.AST | None, names: set[str]) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _result_names(tree: ast.AST, name: str) -> set[str]:
    """``name`` and every name that may hold what it returned, to a fixpoint: bound from an expression that
    mentions one of them (``r = f(1)``, ``for x in f(1)``, ``rs.append(f(1))``), or a function or class whose
    body mentions one. Generous on purpose: it only decides which assertions can earn credit."""
    names = {name}
    size = 0
    while size != len(names):
        size = len(names)
        for node in ast.walk(tree):
            source: ast.AST
            bound: list[ast.expr | None]
            if isinstance(node, ast.Assign):
                source, bound = node.value, [*node.targets]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.NamedExpr):
                source, bound = node.value or node.target, [node.target]
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                source, bound = node.iter, [node.target]
            elif isinstance(node, ast.withitem):
                source, bound = node.context_expr, [node.optional_vars]
            elif (
                isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
            ):
                source, bound = node.value, [node.value.func.value]  # rs.append(f(1)) puts a result into rs
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                source, bound = node, [ast.Name(node.name)]
            else:
                continue
            if _mentions(source, names):
                names.update(n.id for target in bound if target for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


class _Rewriter(ast.NodeTransformer):
    def __init__(self, name: str, result_names: set[str]) -> None:
        self.name = name
        self.result_names = result_names
        self.calls: list[str] = []
        self.counted = 0  # assertions that involve the function's results

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if not (isinstance(node.func, ast.Name) and node.func.id == self.name):
            return self.generic_visit(node)
        if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
            raise UnsupportedTests(f"line {node.lineno} of the tests: {self.name}(...) with keyword or * arguments")
        try:
            values = tuple(ast.literal_eval(arg) for arg in node.args)
        except (ValueError, SyntaxError, TypeError):
            raise UnsupportedTests(
                f"line {node.lineno} of the tests: {self.name}(...) has arguments that are not literals "
                f"({ast.unparse(node)[:60]})"
            ) from None
        self.calls.append(repr(values))
        return ast.Call(ast.Name(RESULT, ast.Load()), [ast.Constant(len(self.calls) - 1)], [])

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.name and isinstance(node.ctx, ast.Load):
            raise UnsupportedTests(f"line {node.lineno} of the tests: {self.name} is used other than by calling it")
        return node

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        # try: _nodus_ok = bool(<test>)
        # except Exception as _nodus_error: _nodus_ok = _nodus_failed(_nodus_error)
        # _nodus_record(_nodus_ok, <counts>)
        # An assertion that involves no result of the function (HumanEval's `assert True, '...'`) says nothing
        # about the completion: it earns no partial credit, but it can still fail, as it would in the benchmark.
        counts = _mentions(node.test, self.result_names)
        self.counted += counts
        test = self.visit(node.test)
        ok = ast.Name("_nodus_ok", ast.Store())
        failed = ast.Call(ast.Name(FAILED, ast.Load()), [ast.Name("_nodus_error", ast.Load())], [])
        attempt = ast.Try(
            body=[ast.Assign([ok], ast.Call(ast.Name("bool", ast.Load()), [test], []))],
            handlers=[
                ast.ExceptHandler(
                    ast.Name("Exception", ast.Load()),
                    "_nodus_error",
                    [ast.Assign([ast.Name("_nodus_ok", ast.Store())], failed)],
                )
            ],
            orelse=[],
            finalbody=[],
        )
        record = ast.Expr(
            ast.Call(ast.Name(RECORD, ast.Load()), [ast.Name("_nodus_ok", ast.Load()), ast.Constant(counts)], [])
        )
        return [attempt, record]


def plan(test_code: str, name: str) -> Plan:
    """Rewrite ``test_code`` whose calls of ``name`` are the calls of the function under test."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as error:
        raise UnsupportedTests(f"the test code is not valid Python ({error.msg}, line {error.lineno})") from None
    if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
        raise UnsupportedTests("the tests have no assert statements")
    rewriter = _Rewriter(name, _result_names(tree, name))
    rewritten = ast.fix_missing_locations(rewriter.visit(tree))
    if not rewriter.calls:
        raise UnsupportedTests(f"the tests never call {name}(...)")
    if not rewriter.counted:
        raise UnsupportedTests(f"no assert statement checks what {name}(...) returns")
    return Plan(rewriter.calls, ast.unparse(rewritten))
