"""The architecture counts of issue "Architecture", from the source alone (nothing is imported but
``agentrl.runner``'s public names): rerun it to see where the house stands.

    .venv/bin/python scripts/arch_counts.py          # one line per count, then RESULT {json}

- ``config_fields_defined_twice``: fields of a run-config section that its converter copies to a runtime
  object field of the same name (``Runtime(x=self.x)``): each such field is defined in both places.
- ``bare_any_in_signatures``: parameters and return values annotated exactly ``Any`` in the functions
  of ``agentrl/runner``, ``agentrl/train`` and ``agentrl/sft``.
- ``forwarding_methods``: methods whose whole body hands the call on to another object's method of the
  same name (``return self.service.train(batch, step)``, ``await self._all("train", ...)``, ``method.remote``).
- ``runner_exports``: names in ``agentrl.runner.__all__``.
- ``imports_against_layers``: imports from a package the layer table of DESIGN.md §2 does not let the
  importing package know (``trajectory`` → ``inspect``, ``environments`` → ``rollout``, ``sft`` → the
  runner's private modules, ...).
- ``duplicate_runs``: pairs of places in ``agentrl/``, ``tools/``, ``environments/`` that share six or
  more consecutive code lines (blank, comment and import lines left out, white space folded).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION_FILES = ["agentrl/runner/_sections.py", "agentrl/runner/_rollout_sections.py", "agentrl/runner/_sync_section.py",
                 "agentrl/runner/_warmup_section.py", "agentrl/runner/_algorithm.py"]
# what each package may import (DESIGN.md §2: data flows upward through the table); the shared utility
# modules (agentrl._config, _enum, _ids, _limits, _unicode, _runfiles, _reaper, model_folder) may be imported by all
UTILITIES = {"_config", "_enum", "_ids", "_limits", "_unicode", "_runfiles", "_reaper", "model_folder"}
LAYERS: dict[str, set[str]] = {
    "chat": {"chat"}, "trajectory": {"chat", "trajectory"}, "episode": {"chat", "trajectory", "episode"},
    "tools": {"chat", "tools"}, "environments": {"chat", "trajectory", "episode", "tools", "environments", "rewards"},
    "rewards": {"chat", "trajectory", "rewards"},
    "inspect": {"chat", "trajectory", "episode", "inspect", "algorithms"},
    # SFT lays conversations out as the agent loop does and trains with the train backends; the
    # runner's private modules are not its to import
    "sft": {"chat", "trajectory", "episode", "algorithms", "train", "sft", "data", "tools", "environments",
            "rollout", "runner"},
}


def _py(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        out += sorted((ROOT / p).rglob("*.py"))
    return out


def config_fields_defined_twice() -> int:
    count = 0
    for rel in SECTION_FILES:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    value = kw.value
                    if (kw.arg and isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                            and value.value.id == "self" and value.attr == kw.arg):
                        count += 1
    return count


def bare_any_in_signatures() -> int:
    count = 0
    for path in _py(["agentrl/runner", "agentrl/train", "agentrl/sft"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                annotations = [a.annotation for a in args] + [node.returns]
                count += sum(1 for a in annotations if isinstance(a, ast.Name) and a.id == "Any")
    return count


def _forwards(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1:
        return False
    stmt = body[0]
    value = stmt.value if isinstance(stmt, ast.Return | ast.Expr) else None
    while isinstance(value, ast.Await | ast.Call) and not (isinstance(value, ast.Call) and _names(value, func.name)):
        inner = value.value if isinstance(value, ast.Await) else (value.args[0] if value.args else None)
        if inner is value or inner is None:
            return False
        value = inner  # dict(await x.f()), list(...), str(...)
    return isinstance(value, ast.Call) and _names(value, func.name)


def _names(call: ast.Call, name: str) -> bool:
    target = call.func
    if isinstance(target, ast.Attribute) and target.attr == name and isinstance(target.value, ast.Attribute | ast.Name):
        return True
    if isinstance(target, ast.Attribute) and target.attr == "remote" and isinstance(target.value, ast.Attribute):
        return target.value.attr == name
    return any(isinstance(a, ast.Constant) and a.value == name for a in call.args[:1])


def forwarding_methods() -> int:
    count = 0
    for path in _py(["agentrl/runner"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                count += sum(1 for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                             and not f.name.startswith("__") and _forwards(f))
    return count


def runner_exports() -> int:
    text = (ROOT / "agentrl/runner/__init__.pyi").read_text() if (ROOT / "agentrl/runner/__init__.pyi").exists() \
        else (ROOT / "agentrl/runner/__init__.py").read_text()
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return len(ast.literal_eval(node.value))
    return 0


def _package(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    if parts[0] == "agentrl" and len(parts) > 1:
        return parts[1].removesuffix(".py")
    if parts[0] in ("tools", "environments"):
        return parts[0]
    return None


def imports_against_layers() -> list[str]:
    found = []
    for path in _py(["agentrl", "tools", "environments"]):
        package = _package(path)
        allowed = LAYERS.get(package or "")
        if allowed is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("agentrl."):
                target = node.module.split(".")[1]
                private = package == "sft" and node.module.startswith("agentrl.runner._")
                if (target not in allowed and target not in UTILITIES) or private:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} -> {node.module}")
    return found


_SKIP = re.compile(r"^(#|import |from \S+ import |\)|\]|\}|\"\"\"|'''|$)")


def duplicate_runs(window: int = 6) -> int:
    seen: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in _py(["agentrl", "tools", "environments"]):
        lines = [(i, " ".join(line.split())) for i, line in enumerate(path.read_text().splitlines(), 1)]
        code = [(i, text) for i, text in lines if not _SKIP.match(text)]
        for k in range(len(code) - window + 1):
            digest = hashlib.sha1("\n".join(t for _, t in code[k:k + window]).encode()).hexdigest()
            seen[digest].append((str(path.relative_to(ROOT)), code[k][0]))
    pairs: set[tuple[str, str]] = set()
    for places in seen.values():
        if 1 < len(places) <= 8:
            for a in places:
                for b in places:
                    if a < b and not (a[0] == b[0] and abs(a[1] - b[1]) < window):
                        pairs.add((a[0] + ":" + b[0], f"{a[1] // 50}-{b[1] // 50}"))
    return len(pairs)


def main() -> None:
    against = imports_against_layers()
    counts = {"config_fields_defined_twice": config_fields_defined_twice(),
              "bare_any_in_signatures": bare_any_in_signatures(), "forwarding_methods": forwarding_methods(),
              "runner_exports": runner_exports(), "imports_against_layers": len(against),
              "duplicate_runs": duplicate_runs()}
    for name, value in counts.items():
        print(f"{name:30} {value}")
    for line in against:
        print(f"  against the layers: {line}")
    print("RESULT " + json.dumps(counts))


if __name__ == "__main__":
    main()
