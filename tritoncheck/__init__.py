"""tritoncheck: numerical-correctness and fuzz testing for Triton kernels.

The engine (registry, strategies, oracle, tolerance core, harness, report, the pytest
plugin and the ``tritoncheck`` command) lives in this package. The suite's own ops
live beside it in the checkout and are its subpackages once installed:
``tritoncheck.kernels`` (``kernels/``), ``tritoncheck.references``,
``tritoncheck.properties`` (per-op specs, rules and checks), ``tritoncheck.controls``
and ``tritoncheck.mutants``. Every module imports them by those names, so the same
code runs installed (``pyproject.toml`` maps the folders) and from the checkout (below).

Public names are imported on first use: ``import tritoncheck`` does not import torch,
and so cannot import triton before the plugin has chosen the backend.

PYTEST_DONT_REWRITE: this file asserts nothing, and the ``tritoncheck`` command imports it
before it starts pytest, whose entry point then marks the whole package for assertion
rewriting and would warn, in every run, that this module was imported too early to be.
"""
from __future__ import annotations

import importlib
from pathlib import Path

__version__ = "0.1.0"

# From a checkout (pytest run in the repository, or the checkout on PYTHONPATH), the
# suite's folders sit beside this package rather than inside it: the checkout's root
# joins this package's search path, so that ``tritoncheck.kernels`` is ``kernels/``
# there exactly as it is once installed. Installed, the folders are copied inside.
_CHECKOUT = Path(__file__).resolve().parent.parent
if not (Path(__file__).parent / "kernels").is_dir() and (_CHECKOUT / "kernels" / "__init__.py").is_file() \
        and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))

# name -> the module that defines it
_PUBLIC = {
    "register_implementation": "registry",
    "Implementation": "registry",
    "OpSpec": "registry",
    "Check": "registry",
    "OPS": "registry",
    "ExpectedFailure": "declarations",
    "Limits": "limits",
    "Case": "strategies",
    "TensorSpec": "strategies",
    "Refusal": "refusals",
    "verify": "verifier",
    "Verdict": "verifier",
    # defining an op of your own (docs/your-op.md)
    "op": "define.op",
    "Definition": "define.op",
    "Tensor": "define.signature",
    "Scalar": "define.signature",
    "Output": "define.signature",
    "Dim": "define.signature",
    "finite": "define.domains",
    "reals": "define.domains",
    "positive": "define.domains",
    "unit_interval": "define.domains",
    "probabilities": "define.domains",
    "integers": "define.domains",
}
# modules reached as attributes: tritoncheck.rules.derived(), .parity(), .allclose()
_MODULES = {"rules": "define.rules"}
__all__ = ["__version__", *_PUBLIC, *_MODULES]


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{_MODULES[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC, *_MODULES])
