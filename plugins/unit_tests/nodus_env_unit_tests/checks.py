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


class _Rewriter(ast.NodeTransformer):
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

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
        # _nodus_record(_nodus_ok)
        test = self.visit(node.test)
        ok = ast.Name("_nodus_ok", ast.Store())
        failed = ast.Call(ast.Name(FAILED, ast.Load()), [ast.Name("_nodus_error", ast.Load())], [])
        attempt = ast.Try(
            body=[ast.Assign([ok], ast.Call(ast.Name("bool", ast.Load()), [test], []))],
            handlers=[ast.ExceptHandler(ast.Name("Exception", ast.Load()), "_nodus_error",
                                        [ast.Assign([ast.Name("_nodus_ok", ast.Store())], failed)])],
            orelse=[], finalbody=[],
        )
        record = ast.Expr(ast.Call(ast.Name(RECORD, ast.Load()), [ast.Name("_nodus_ok", ast.Load())], []))
        return [attempt, record]


def plan(test_code: str, name: str) -> Plan:
    """Rewrite ``test_code`` whose calls of ``name`` are the calls of the function under test."""
    try:
        tree = ast.parse(test_code)
    except SyntaxError as error:
        raise UnsupportedTests(f"the test code is not valid Python ({error.msg}, line {error.lineno})") from None
    if not any(isinstance(node, ast.Assert) for node in ast.walk(tree)):
        raise UnsupportedTests("the tests have no assert statements")
    rewriter = _Rewriter(name)
    rewritten = ast.fix_missing_locations(rewriter.visit(tree))
    if not rewriter.calls:
        raise UnsupportedTests(f"the tests never call {name}(...)")
    return Plan(rewriter.calls, ast.unparse(rewritten))
