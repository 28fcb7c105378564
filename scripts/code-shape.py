#!/usr/bin/env python3
"""Fails when product code outgrows the shape the project holds it to: no function over
MAX_FUNCTION lines in any crate's `src` (unit-test modules excluded), and no file over
MAX_HTTP_FILE lines in fulcrum-http, the crate every request goes through.

A long function is several steps without names; a reader has to find where each starts. The
count runs from a `fn` line to the closing brace at the same indentation, which is how rustfmt
lays functions out (the test command checks formatting first). Usage: scripts/code-shape.py
"""
import pathlib
import re
import sys

MAX_FUNCTION = 150
MAX_HTTP_FILE = 1000
FN = re.compile(
    r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)"
)


def is_test_file(path):
    return (
        "tests" in path.parts
        or path.name in ("tests.rs", "testutil.rs", "testing.rs")
        or "fulcrum-testkit" in path.parts
    )


def long_functions(path):
    lines = path.read_text().split("\n")
    in_tests_from = None
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and "mod " in lines[i + 1]:
            in_tests_from = i
            break
    for i, line in enumerate(lines):
        if in_tests_from is not None and i >= in_tests_from:
            break
        m = FN.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        indent = m.group(1)
        close = indent + "}"
        for j in range(i + 1, len(lines)):
            if lines[j] == close:
                if j - i + 1 > MAX_FUNCTION:
                    yield (i + 1, m.group(2), j - i + 1)
                break


def main():
    root = pathlib.Path(__file__).resolve().parent.parent / "crates"
    failures = []
    for path in sorted(root.glob("*/src/**/*.rs")):
        if is_test_file(path.relative_to(root)):
            continue
        for line, name, length in long_functions(path):
            failures.append(f"{path.relative_to(root.parent)}:{line}: fn {name} is {length} lines")
    for path in sorted((root / "fulcrum-http" / "src").rglob("*.rs")):
        n = len(path.read_text().split("\n")) - 1
        if n > MAX_HTTP_FILE and not is_test_file(path.relative_to(root)):
            failures.append(f"{path.relative_to(root.parent)}: {n} lines")
    if failures:
        print(f"functions over {MAX_FUNCTION} lines, or fulcrum-http files over {MAX_HTTP_FILE}:")
        print("\n".join(failures))
        sys.exit(1)
    print(f"no function over {MAX_FUNCTION} lines; no fulcrum-http file over {MAX_HTTP_FILE}")


main()
