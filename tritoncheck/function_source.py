"""A function, and what it needs, as a module another process can import (for ``verify``).

:func:`tritoncheck.verify` runs the implementation in a spawned child, which imports it.
A function at the top of a module file is imported by name (:func:`import_path`). One
defined in a notebook cell, by ``exec`` of generated source, or in a ``__main__`` with no
file (a REPL, a script read from stdin) has no module the child could import; its
source may still be in ``linecache``: IPython keeps every cell there, Python 3.13's REPL
its inputs, and a caller that ``exec``s generated code may register it.
:func:`module_source` slices from there the top-level statements the function needs
(its ``def`` with decorators, the imports, helpers, kernels and constants it names,
recursively, and the attribute declarations made on them such as ``fn.dtypes = ...``),
and never the rest of a cell (a training loop beside a kernel is not run again). A
global whose defining statement cannot be found is written from its value where that is
exact (a module, an importable function, a literal); anything else is a ``TypeError`` at
the call that names it and says what to pass instead.
"""
from __future__ import annotations

import ast
import builtins
import linecache
import os
import sys
import types
from typing import Callable, Iterator

_BUILTINS = frozenset(dir(builtins))
# how IPython names the pseudo-files of its cells (ipykernel >= 6, older IPython)
_CELL_MARKERS = ("ipykernel_", "<ipython-input-")


def import_path(fn: Callable) -> str | None:
    """``module:qualname`` when a fresh process that imports ``module`` finds ``fn`` there:
    a module with a file, other than ``__main__``."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "<")
    loaded = sys.modules.get(module) if module else None
    if loaded is None or module == "__main__" or "<" in qualname or not getattr(loaded, "__file__", None):
        return None
    found = loaded
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is fn else None


def defined_in_main_script(fn: Callable) -> bool:
    """Whether ``fn`` is a top-level function of a ``__main__`` read from a file, which a
    spawned child runs again (as ``__mp_main__``) and so can unpickle ``fn`` from."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    name = getattr(fn, "__qualname__", "<")
    return (getattr(fn, "__module__", None) == "__main__" and bool(path) and os.path.isfile(path)
            and "." not in name and getattr(main, name, None) is fn)


def _function_of(obj) -> types.FunctionType | None:
    """The Python function under ``obj``: a function, a ``triton.jit`` kernel, an autotuner
    or heuristics over one."""
    for _ in range(6):
        if isinstance(obj, types.FunctionType):
            return obj
        obj = getattr(obj, "fn", None)
    return None


def _statements(filename: str) -> list[ast.stmt] | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    try:
        return ast.parse("".join(lines), filename).body
    except SyntaxError:
        return None


def _binds(stmt: ast.stmt) -> set[str]:
    """The names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in stmt.names if a.name != "*"}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else \
        [stmt.target] if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _declares(stmt: ast.stmt) -> set[str]:
    """The names a top-level ``name.attribute = value`` statement declares something on."""
    if not isinstance(stmt, ast.Assign):
        return set()
    return {t.value.id for t in stmt.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)}


def _free(stmt: ast.stmt) -> set[str]:
    """Names a statement reads and does not bind anywhere in itself (a superset of its globals)."""
    loads, stores = set(), set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, ast.arg):
            stores.add(node.arg)
    return loads - stores


def _needed_at_definition(stmt: ast.stmt) -> set[str]:
    """The names a statement reads when it runs: a ``def``'s decorators and defaults, a
    class's bases and decorators (their bodies run later), anything else's all."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        parts = [*stmt.decorator_list, *stmt.args.defaults, *(d for d in stmt.args.kw_defaults if d is not None)]
    elif isinstance(stmt, ast.ClassDef):
        parts = [*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords)]
    else:
        return _free(stmt)
    return {n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name)}


def _cells() -> Iterator[str]:
    """IPython's cells in linecache, the latest first."""
    return reversed([f for f in list(linecache.cache) if any(m in f for m in _CELL_MARKERS)])


def _value_line(name: str, value, owner: str) -> str:
    """``name`` written from its value, where that is exact; else a TypeError saying what to do."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__}" if value.__name__ == name else f"import {value.__name__} as {name}"
    path = import_path(value) if callable(value) else None
    if path is not None and "." not in path.partition(":")[2]:
        module, _, attr = path.partition(":")
        return f"from {module} import {attr}" + ("" if attr == name else f" as {name}")
    text = repr(value)
    try:
        if ast.literal_eval(text) == value:
            return f"{name} = {text}"
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    raise TypeError(f"verify: {owner} uses the global {name!r} (a {type(value).__name__}) whose definition is not "
                    "in the source Python kept; define it beside the function, or pass the whole source: "
                    f"verify(op, {owner!r}, source=...)")


def module_source(fn: Callable) -> str:
    """The source of a module that defines ``fn`` (under its ``__name__``) and what it needs,
    sliced from the source ``linecache`` holds for it (module docstring); a TypeError that
    says what to do where there is none."""
    base = _function_of(fn)
    name = getattr(fn, "__name__", None) or getattr(base, "__name__", "fn")
    if base is None:
        raise TypeError(f"verify: {fn!r} is not a Python function; pass 'module:function' or source=")
    origin = base.__code__.co_filename
    if _statements(origin) is None:
        raise TypeError(
            f"verify: {name} was defined in {origin} (an interactive session, a script read from stdin, or exec of a "
            "string), whose source Python did not keep, so the verifier's child process cannot rebuild it. Pass the "
            f"source that defines it: verify(op, {name!r}, source=code), or define it in a file and pass "
            "'module:function'")
    namespace = base.__globals__
    files = [origin]
    chosen: dict[tuple[str, int], ast.stmt] = {}
    lifted: dict[str, str] = {}
    needed, seen = [name], set()
    while needed:
        wanted = needed.pop()
        if wanted in seen or (wanted in _BUILTINS and wanted not in namespace):
            continue
        seen.add(wanted)
        value = namespace.get(wanted)
        home = _function_of(value)
        if home is not None and home.__code__.co_filename not in files and _statements(home.__code__.co_filename):
            files.append(home.__code__.co_filename)
        places = _binding(wanted, files) or _binding(wanted, [c for c in _cells() if c not in files])
        if not places:
            if wanted == name:
                raise TypeError(f"verify: {name} is not defined by a top-level statement of {origin}; pass the source "
                                f"that defines it: verify(op, {name!r}, source=code)")
            if wanted in namespace:
                lifted[wanted] = _value_line(wanted, value, name)
            continue
        files.extend(f for f, _ in places if f not in files)
        for key in places + _declaring(wanted, files):
            if key not in chosen:
                chosen[key] = _statements(key[0])[key[1]]
                needed.extend(_free(chosen[key]))
    order = {f: i for i, f in enumerate(linecache.cache)}  # IPython caches cells as it runs them
    keyed = sorted(chosen.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1]))
    imports = [s for _, s in keyed if isinstance(s, (ast.Import, ast.ImportFrom))]
    future = [s for s in imports if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    body = [ast.unparse(s) for s in future + [s for s in imports if s not in future]]
    body += list(lifted.values())
    body += [ast.unparse(s) for s in _definition_order([s for _, s in keyed if s not in imports])]
    head = (f'"""{name}, and what it needs, sliced by tritoncheck.verify from the source Python kept for it '
            f'({", ".join(sorted(set(f for f, _ in chosen)))})."""')
    return "\n\n".join([head, *body]) + "\n"


def _binding(name: str, files: list[str]) -> list[tuple[str, int]]:
    """(file, statement index) of the top-level statements that bind ``name``, in the first of ``files`` that has one."""
    for filename in files:
        found = [(filename, i) for i, s in enumerate(_statements(filename) or ()) if name in _binds(s)]
        if found:
            return found
    return []


def _declaring(name: str, files: list[str]) -> list[tuple[str, int]]:
    """(file, statement index) of every ``name.attribute = ...`` in ``files``: what ``name`` declares."""
    return [(f, i) for f in files for i, s in enumerate(_statements(f) or ()) if name in _declares(s)]


def _definition_order(statements: list[ast.stmt]) -> list[ast.stmt]:
    """``statements`` in their order, except that each comes after the statements binding a
    name it needs when it runs (:func:`_needed_at_definition`): a kernel decorated with
    a config list from a later cell."""
    placed: list[ast.stmt] = []
    waiting = list(statements)
    while waiting:
        ready = next((s for s in waiting if not any(
            n in _binds(o) for n in _needed_at_definition(s) for o in waiting if o is not s)), waiting[0])
        placed.append(ready)
        waiting.remove(ready)
    return placed
