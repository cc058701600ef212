"""Planted-bug implementations: each is a project kernel with one source-level patch.

A mutant is made the way mutation-testing tools make them: take the source of a
kernel module, replace one exact snippet (which must occur exactly once, so a
kernel edit that moves the snippet breaks the mutant loudly instead of silently
leaving it equal to the kernel), write the result to ``.mutants/`` and import it.
Triton reads a kernel's source with ``inspect``, so the patched module must live in
a real file. Every mutant then runs the same launch code, block sizes and wrapper
checks as the kernel it was made from, and differs from it in the planted bug only.

Each ``mutants/<family>.py`` declares its mutants with :func:`mutant`; the returned
object is a contract-conforming function, so ``--impl softmax=tritoncheck.mutants.softmax:NAME``
works like any user kernel.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable


def _cache_dir() -> Path:
    """Where patched modules are written: ``.mutants/`` in a checkout (ignored by git), the
    user's cache directory once installed (site-packages may not be writable)."""
    if os.environ.get("TRITONCHECK_MUTANT_DIR"):
        return Path(os.environ["TRITONCHECK_MUTANT_DIR"])
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".mutants"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tritoncheck" / "mutants"


_CACHE = _cache_dir()


@dataclass(frozen=True)
class Mutant:
    """A planted bug: where it is, what it models, and which checks must catch it."""

    name: str
    op: str
    fn: Callable
    bug: str
    kills: tuple[str, ...]
    module: str = ""  # where the mutant is defined, e.g. "tritoncheck.mutants.softmax"
    # where the planted difference exists, with why not elsewhere: (backends, reason)
    only_on: tuple[tuple[str, ...], str] | None = None

    def __post_init__(self):
        if self.only_on is not None:
            from tritoncheck.declarations import BACKEND_NAMES
            backends, reason = self.only_on
            if not backends or not set(backends) <= set(BACKEND_NAMES) or not reason:
                raise ValueError(f"mutant {self.name!r}: only_on must be (backends among {BACKEND_NAMES}, "
                                 f"a non-empty reason), got {self.only_on!r}")

    def absent_on(self, backend: str) -> str | None:
        """Why the planted bug does not exist on ``backend``, or None where it does."""
        if self.only_on is None or backend in self.only_on[0]:
            return None
        return f"mutant {self.name} exists only on {', '.join(self.only_on[0])}: {self.only_on[1]}"

    @property
    def target(self) -> str:
        """``module:name``, importable: what ``--impl`` and replay files name."""
        return f"{self.module}:{self.name}"

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        # What the kernel declares (dtypes, supports_backward, fp32_dot_precision, ...)
        # holds for its mutant too.
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)


def _patched_module(module: ModuleType, patches: tuple[tuple[str, str], ...], tag: str) -> ModuleType:
    source = inspect.getsource(module)
    for old, new in patches:
        count = source.count(old)
        if count != 1:
            raise ValueError(
                f"mutant {tag!r}: the snippet {old!r} occurs {count} times in "
                f"{module.__name__}; it must occur exactly once (update the mutant "
                f"after editing the kernel)"
            )
        source = source.replace(old, new)
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    name = f"_mutant_{tag}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    _CACHE.mkdir(parents=True, exist_ok=True)
    path = _CACHE / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        # xdist workers collect at the same time: a reader must never see a half-written
        # file (a truncated module imports without the op's function), so write then rename
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    patched = importlib.util.module_from_spec(spec)
    sys.modules[name] = patched
    spec.loader.exec_module(patched)
    return patched


def mutant(
    op: str,
    module: ModuleType,
    patches: list[tuple[str, str]] | tuple[tuple[str, str], ...],
    *,
    name: str,
    bug: str,
    kills: tuple[str, ...],
    attr: str | None = None,
    only_on: tuple[tuple[str, ...], str] | None = None,
) -> Mutant:
    """Make the mutant ``name`` of ``op`` by applying ``patches`` to ``module``.

    ``bug`` is the docstring a user reads: the planted bug, the real-world bug class
    it models and the input that triggers it. ``kills`` names the checks that must
    fail on it (the self-test asserts each one does). ``attr`` is the function to
    take from the patched module (default: ``op``). ``only_on`` = (backends, why): a
    patch whose difference one backend's code generation erases is no bug there.
    """
    if not kills:
        raise ValueError(f"mutant {name!r} must name at least one check in kills")
    patched = _patched_module(module, tuple(patches), f"{op}_{name}")
    fn = getattr(patched, attr or op)
    return Mutant(name=name, op=op, fn=fn, bug=bug, kills=tuple(kills),
                  module=sys._getframe(1).f_globals.get("__name__", ""), only_on=only_on)
