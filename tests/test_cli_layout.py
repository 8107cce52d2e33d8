"""The command line stays thin: a command parses its arguments and calls the package, so no function in
slea/cli/ has a body longer than :data:`MAX_BODY_LINES` lines. A command's signature (its options, with their
help) and its docstring (its --help text) are its declaration and are not counted."""

import ast
from pathlib import Path

import slea.cli

MAX_BODY_LINES = 40
CLI = Path(slea.cli.__file__).parent


def body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the function's last line, blank lines and comments
    inside included."""
    body = fn.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return fn.end_lineno - body[0].lineno + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> list[tuple[str, int]]:
    """``(name, body lines)`` of every function (methods and nested ones too) whose body is longer than
    ``limit``."""
    return [(n.name, body_lines(n)) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and body_lines(n) > limit]


def test_body_lines_counts_from_after_the_docstring_to_the_end():
    src = ('def f(\n    a: int = 1,\n    b: int = 2,\n) -> None:\n    """Doc\n    on two lines."""\n    x = a\n\n'
           '    # a comment\n    return x + b\n\n\ndef g():\n    return 1\n\n\ndef h():\n    """Only a docstring."""\n')
    fns = {n.name: n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
    assert body_lines(fns["f"]) == 4  # "x = a", the blank line, the comment, "return x + b"; not the 4 + 2 above
    assert body_lines(fns["g"]) == 1
    assert body_lines(fns["h"]) == 1  # a docstring alone is the body
    assert long_functions(src, limit=3) == [("f", 4)]
    assert long_functions(src, limit=4) == []


def test_no_cli_function_is_longer_than_the_limit():
    files = sorted(CLI.glob("*.py"))
    assert len(files) >= 8  # the package's modules are all here (main, play, launch, ...)
    long = {f"{f.name}:{name}": n for f in files for name, n in long_functions(f.read_text())}
    assert long == {}, f"functions in slea/cli/ longer than {MAX_BODY_LINES} lines: move their work into the package"
