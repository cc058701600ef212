"""Where the command and the plugin find ops defined outside the suite (``tritoncheck.op``).

Three places, all imported before any ``--impl`` is resolved, in every xdist worker too:

* the command line: ``--op-module mypkg.ops`` (repeatable), or an op named with its module
  in an ``--impl``: ``mypkg.ops:matmul=mypkg.kernels:matmul``;
* the project's ``pyproject.toml`` (the current directory's, or the nearest above it)::

      [tool.tritoncheck]
      op-modules = ["mypkg.ops"]

* installed packages' entry points in the group ``tritoncheck.ops`` (a library that ships
  op definitions for its kernels).

Importing a module runs its ``@tritoncheck.op`` decorators, which register the ops.
"""
from __future__ import annotations

import importlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable

ENTRY_POINT_GROUP = "tritoncheck.ops"


def pyproject_modules(start: Path | None = None) -> list[str]:
    """``[tool.tritoncheck] op-modules`` of the nearest pyproject.toml at or above ``start``."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise ValueError(f"{path}: cannot read it for [tool.tritoncheck] op-modules ({exc})") from None
            modules = data.get("tool", {}).get("tritoncheck", {}).get("op-modules", [])
            if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
                raise ValueError(f"{path}: [tool.tritoncheck] op-modules must be a list of module names, "
                                 f"got {modules!r}")
            return modules
    return []


def entry_point_modules() -> list[str]:
    return [ep.value.partition(":")[0] for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)]


def import_modules(modules: Iterable[str], where: str) -> list[str]:
    """Import each module (registering its ops); the names of the ops they define."""
    from tritoncheck.define.op import DEFINITIONS
    before = set(DEFINITIONS)
    for name in dict.fromkeys(modules):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                raise ValueError(f"{where} {name!r}: no such module (is it on PYTHONPATH or in the current "
                                 "directory?)") from None
            raise ValueError(f"{where} {name!r}: importing it failed: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the module's own error, named
            raise ValueError(f"{where} {name!r}: importing it failed: {type(exc).__name__}: {exc}") from exc
    return sorted(set(DEFINITIONS) - before)


def load(command_line: Iterable[str] = (), impl_ops: Iterable[str] = ()) -> list[str]:
    """Import every definition module the run names (module docstring); ``impl_ops`` are the
    OP parts of ``--impl`` (``module:op`` imports ``module``)."""
    from tritoncheck import registry
    registry.load()
    defined = import_modules(pyproject_modules(), "pyproject.toml [tool.tritoncheck] op-modules")
    defined += import_modules(entry_point_modules(), f"entry point ({ENTRY_POINT_GROUP})")
    defined += import_modules(command_line, "--op-module")
    defined += import_modules((op.partition(":")[0] for op in impl_ops if ":" in op), "--impl")
    return defined


def op_name(spec: str) -> str:
    """The op an ``--impl``'s OP part names: ``matmul`` or ``mypkg.ops:matmul``."""
    return spec.rpartition(":")[2].strip()
