"""Tasks for "fix the failing test" (:mod:`agentrl.environments.fix_test`), and a policy that solves them.

:func:`make_fix_rows` generates, from a seed, small Python packages: ``<pkg>/core.py`` holds three
functions drawn from :data:`FUNCTIONS`, one with an injected bug (an off-by-one, a wrong operator, a
lost case...), ``tests/test_core.py`` has unittest tests (one fails because of the bug),
``run_tests.py`` runs them. Each row also carries *hidden* tests (more cases, every function), never
written into the workspace, and the fix (``path``, ``old``, ``new``) — which only the scripted policy
reads. Tests use the standard library's ``unittest``, so they run in the bare sandbox interpreter.

:func:`scripted_fix_policy` is a fake engine's policy (:class:`agentrl.testing.policy.FakePolicyClient`)
that solves a task the way an agent would: run the tests, read the file, look at the package in the
Python kernel, edit the bug, run the tests again, answer. ``cheat=True`` instead edits the visible
tests and the test runner so that they pass, leaving the bug: the reward must be 0 for it.

Example::

    rows = make_fix_rows(8, seed=0)
    policy = scripted_fix_policy(rows)
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FUNCTIONS", "PACKAGES", "FixFunction", "make_fix_rows", "scripted_fix_policy"]


@dataclass(frozen=True)
class FixFunction:
    """A function of the generated packages: its source, a bug (``old`` -> ``bad`` in the source), the
    visible test lines (the first one fails with the bug) and the hidden test lines."""

    name: str
    source: str
    old: str
    bad: str
    visible: tuple[str, ...]
    hidden: tuple[str, ...]


FUNCTIONS: tuple[FixFunction, ...] = (
    FixFunction("clamp", "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", "min(x, hi)", "min(x, lo)",
                ("self.assertEqual(clamp(5, 0, 10), 5)", "self.assertEqual(clamp(-3, 0, 10), 0)"),
                ("self.assertEqual(clamp(5, 0, 10), 5)", "self.assertEqual(clamp(11, 0, 10), 10)",
                 "self.assertEqual(clamp(-1, 0, 10), 0)", "self.assertEqual(clamp(7, 7, 9), 7)")),
    FixFunction("mean", "def mean(xs):\n    return sum(xs) / len(xs)\n", "/ len(xs)", "/ (len(xs) - 1)",
                ("self.assertEqual(mean([2, 4, 6]), 4)", "self.assertEqual(mean([3, 3]), 3)"),
                ("self.assertEqual(mean([2, 4, 6]), 4)", "self.assertEqual(mean([1, 2]), 1.5)",
                 "self.assertEqual(mean([5, 5, 5, 5]), 5)")),
    FixFunction("count_vowels", "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in \"aeiou\")\n",
                "\"aeiou\"", "\"aeio\"",
                ("self.assertEqual(count_vowels(\"unusual\"), 4)", "self.assertEqual(count_vowels(\"xyz\"), 0)"),
                ("self.assertEqual(count_vowels(\"unusual\"), 4)", "self.assertEqual(count_vowels(\"AEIOU\"), 5)",
                 "self.assertEqual(count_vowels(\"rhythm\"), 0)", "self.assertEqual(count_vowels(\"queue\"), 4)")),
    FixFunction("running_sum",
                "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n"
                "        out.append(total)\n    return out\n", "total += x", "total = x",
                ("self.assertEqual(running_sum([1, 2, 3]), [1, 3, 6])", "self.assertEqual(running_sum([]), [])"),
                ("self.assertEqual(running_sum([1, 2, 3]), [1, 3, 6])", "self.assertEqual(running_sum([5]), [5])",
                 "self.assertEqual(running_sum([2, -2, 2]), [2, 0, 2])")),
    FixFunction("factorial",
                "def factorial(n):\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n"
                "    return result\n", "range(2, n + 1)", "range(2, n)",
                ("self.assertEqual(factorial(5), 120)", "self.assertEqual(factorial(0), 1)"),
                ("self.assertEqual(factorial(5), 120)", "self.assertEqual(factorial(1), 1)",
                 "self.assertEqual(factorial(3), 6)", "self.assertEqual(factorial(10), 3628800)")),
    FixFunction("gcd", "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return abs(a)\n", "return abs(a)",
                "return a", ("self.assertEqual(gcd(12, -18), 6)", "self.assertEqual(gcd(7, 5), 1)"),
                ("self.assertEqual(gcd(-12, 18), 6)", "self.assertEqual(gcd(12, -18), 6)",
                 "self.assertEqual(gcd(0, 9), 9)", "self.assertEqual(gcd(21, 14), 7)")),
    FixFunction("dedupe", "def dedupe(xs):\n    return list(dict.fromkeys(xs))\n", "list(dict.fromkeys(xs))",
                "sorted(set(xs))", ("self.assertEqual(dedupe([3, 1, 3, 2]), [3, 1, 2])",
                                    "self.assertEqual(dedupe([]), [])"),
                ("self.assertEqual(dedupe([3, 1, 3, 2]), [3, 1, 2])", "self.assertEqual(dedupe([\"b\", \"a\", \"b\"]), "
                 "[\"b\", \"a\"])", "self.assertEqual(dedupe([1, 1, 1]), [1])")),
    FixFunction("word_count", "def word_count(s):\n    return len(s.split())\n", "s.split()", "s.split(\" \")",
                ("self.assertEqual(word_count(\"a  b\"), 2)", "self.assertEqual(word_count(\"one\"), 1)"),
                ("self.assertEqual(word_count(\"a  b\"), 2)", "self.assertEqual(word_count(\" lead and trail \"), 3)",
                 "self.assertEqual(word_count(\"\"), 0)")),
)

PACKAGES: tuple[str, ...] = ("tallyho", "numkit", "smallmath", "textbits", "listy", "mintools", "quickcalc", "utilo")

RUN_TESTS = '''"""Runs the package's tests: python3 run_tests.py"""
import sys
import unittest

suite = unittest.defaultTestLoader.discover("tests", top_level_dir=".")
result = unittest.TextTestRunner(verbosity=2).run(suite)
sys.exit(0 if result.wasSuccessful() else 1)
'''


def _test_module(pkg: str, funcs: Sequence[FixFunction], lines: Callable[[FixFunction], Sequence[str]],
                 cls: str) -> str:
    names = ", ".join(f.name for f in funcs)
    body = [f"import unittest\n\nfrom {pkg}.core import {names}\n\n\nclass {cls}(unittest.TestCase):"]
    for f in funcs:
        checks = "\n".join(f"        {line}" for line in lines(f))
        body.append(f"    def test_{f.name}(self):\n{checks}\n")
    return "\n".join(body)


def make_fix_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` tasks (deterministic for a seed); see the module doc for a row's fields."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"make_fix_rows(n={n!r}): expected an int >= 1")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        pkg = f"{PACKAGES[i % len(PACKAGES)]}{i // len(PACKAGES) or ''}"
        funcs = rng.sample(FUNCTIONS, 3)
        buggy = rng.choice(funcs)
        core = "\n\n".join(f.source.replace(f.old, f.bad) if f is buggy else f.source for f in funcs)
        path = f"{pkg}/core.py"
        files = {
            f"{pkg}/__init__.py": f"from {pkg}.core import *  # noqa: F401,F403\n",
            path: f'"""Small helpers."""\n\n\n{core}',
            "tests/__init__.py": "",
            "tests/test_core.py": _test_module(pkg, funcs, lambda f: f.visible, "TestCore"),
            "run_tests.py": RUN_TESTS,
        }
        hidden = {"test_hidden.py": _test_module(pkg, funcs, lambda f: f.hidden, "TestHidden")}
        rows.append({"task_id": f"fix-{seed:02d}-{i:04d}", "package": pkg, "files": files, "hidden_tests": hidden,
                     "hidden_count": len(funcs), "fix": {"path": path, "old": buggy.bad, "new": buggy.old}})
    return rows


# --------------------------------------------------------------------------- the scripted policy

_TASK = re.compile(r"Task (fix-\d+-\d+)")


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call><|im_end|>"


def scripted_fix_policy(rows: Sequence[dict[str, Any]], *, cheat: bool = False,
                        solve: Callable[[Any], bool] | None = None) -> Callable[[Any], str]:
    """A fake engine's policy for ``rows`` (Qwen3 JSON tool calls). ``solve(request)`` may decline to
    fix (the episode then ends without a fix: reward 0); ``cheat`` games the visible tests instead."""
    tasks = {str(r["task_id"]): r for r in rows}

    def policy(req: Any) -> str:
        text = req.text
        found = _TASK.findall(text)
        if not found or found[0] not in tasks:
            return "I cannot tell which task this is.<|im_end|>"
        row = tasks[found[0]]
        fix, pkg = row["fix"], row["package"]
        step = text.count("<tool_response>")
        if step == 0:
            return _call("bash", command="python3 run_tests.py 2>&1 | tail -n 5")
        if step == 1:
            return _call("read_file", path=fix["path"])
        if step == 2:
            return _call("python", code=f"import {pkg}\nsorted(n for n in dir({pkg}) if not n.startswith('_'))")
        if step == 3:
            if cheat:
                return _call("write_file", path="run_tests.py", content="print('OK')\n")
            if solve is not None and not solve(req):
                return "I could not find the bug.<|im_end|>"
            return _call("edit_file", path=fix["path"], old_text=fix["old"], new_text=fix["new"])
        if step == 4:
            if cheat:
                return _call("write_file", path="tests/test_core.py", content="import unittest\n")
            return _call("bash", command="python3 run_tests.py")
        if step == 5 and cheat:
            return _call("write_file", path="conftest.py", content="import sys\nsys.exit(0)\n")
        return f"Done: the tests pass now ({fix['path']}).<|im_end|>"

    return policy
