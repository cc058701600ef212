"""The pages generated from the op records, so that they cannot drift from the code.

``python -m tritoncheck.contract`` prints the ops table (``pytest --list-ops`` prints the
same); ``--write`` writes every generated page and block:

- ``docs/contract.md``, the whole contract: the general rules, every op's signature,
  shapes, semantics, dtypes and gradients, how an implementation is called, what a refusal
  is, and the limits a kernel may declare (``tritoncheck/limits.py`` KEYS);
- ``docs/checks-by-op.md``: every check of every op (its docstring's first paragraph), the
  planted bugs that must fail it and the controls that must pass it;
- the block between ``<!-- generated:NAME:start -->`` and ``<!-- generated:NAME:end -->``
  in a hand-written page: the README's list of ops, the declarations page's table of
  attributes (``tritoncheck/declarations.py`` ATTRIBUTES).

``--check`` exits 1 naming the stale files; tests/test_registry.py fails on them too.
"""
from __future__ import annotations

from pathlib import Path

from tritoncheck import backend, declarations, generic, limits, registry

ROOT = Path(__file__).resolve().parents[1]


def _dtypes(op) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in op.dtypes)


def markdown_table() -> str:
    ops = registry.load()
    lines = ["| op | signature | dtypes | autograd | checks |", "|---|---|---|---|---|"]
    for name in sorted(ops):
        op = ops[name]
        grads = ", ".join(op.grad_inputs) or "none"
        checks = ", ".join(f"`{c.name}`" for c in op.checks)
        lines.append(f"| `{name}` | `{op.signature}` | {_dtypes(op)} | {grads} | {checks} |")
    return "\n".join(lines)


RULES = """\
Every op the suite checks has one public signature. The project's Triton kernels
implement it, the fp64 references implement it, and so does any kernel a user brings
(`--impl OP=package.module:function`). The suite treats an implementation as a black
box: it calls the function, compares against the references and checks the properties.

General rules, for every op:
- Inputs are `torch.Tensor`s on one device (CUDA, or CPU under the Triton interpreter).
  They may be non-contiguous (transposed views, steps, storage offsets); an
  implementation that needs contiguity makes its own copy, or declares the limit
  (below). Inputs are never modified.
- Floating dtypes: float32, float16, bfloat16. Outputs have the input's dtype unless
  the table says otherwise, and are new tensors. Ops with autograd inputs return
  tensors that backpropagate to the inputs named.
- Bad input (mismatched shapes, an unsupported dtype or head dim, tensors on two
  devices, a target index out of range) raises `ValueError` or `TypeError` with a
  message naming the argument; it never returns garbage and never crashes the process.
"""

REFUSALS = """\
## Refusals

An implementation may accept only part of the domain, and says which part: a refusal is
what it declares to be one (`tritoncheck/refusals.py`). Declared: raising
`tritoncheck.Refusal` (a `ValueError`) or a subclass, out of the implementation before
it returns; an exception that matches `fn.refuses` (message patterns for `ValueError`,
`TypeError` and `NotImplementedError`, or `(exception type, pattern)` pairs); and the
declared limits (below), which keep the refused inputs from being drawn at all. A
declared refusal discards the example (another is drawn), and is counted per test and
per op and dtype, with its distinct messages (and how often each came), at the head of
the terminal summary and of every report and beside a failure; a test in which every
example was refused is reported as skipped with the messages, never as passed. The
project's own kernels, planted bugs and controls accept the whole contract: a refusal
from them fails.

Everything else a user's implementation raises fails its test, an undeclared `ValueError`,
`TypeError` or `NotImplementedError` included (a typo's `TypeError` looks exactly like
a refusal): each input it raised on is recorded and replaced by another, so that the
check still judges the inputs it accepts, and the test fails at its end naming the
error, on how many of how many inputs, what sets those inputs apart from the accepted
ones (`causal=False`, cos in another dtype than x, `N >= 65`), the declaration that
would say so, and the first one's case, replay and traceback (docs/verdicts.md). A test
whose first ten inputs all raised ends there. With `--refusals=discard` undeclared
refusals are counted as refusals instead, and a test in which they took more than 20%
of the examples fails, naming them and the first one's traceback; with `--refusals=fail`
every refusal fails. Never a refusal, whatever is declared: an `AssertionError`, an
error raised inside Triton's compiler, launcher or interpreter (unless declared by its
type), a result of the wrong shape or dtype, a wrong or non-finite value, an error in
the backward (the forward accepted the input), and an exception raised by the suite's
own code around the call. A signature that cannot bind the contract's arguments is a
usage error when the implementation is loaded.

A test passes only if at least half of its examples counted (ran the check to the end,
neither refused nor discarded by the check's preconditions); fewer fail it as not
reached.
"""

CALLING = """\
## How an implementation is called

The suite reads the function's signature (for a `torch.autograd.Function`'s `apply`, its
`forward` less `ctx`) and calls it as Python binds it (`tritoncheck/calling.py`): the
arguments without a default positionally, in the table's order; an optional one by
keyword where the signature takes that name (keyword-only parameters and `**kwargs`
included), else positionally where a parameter sits at its place in the table's order,
else not at all. An optional argument the function cannot take is held at its default in
every drawn case, and a check that needs another value of it is skipped as not
applicable, with the reason, in the terminal and the report (never passed). A binding
error on a case the signature can take is a failure. Declarations for the rest of a
library's convention, validated when the implementation is loaded:

- `fn.argument_names = {"sm_scale": "softmax_scale", "causal": "is_causal"}`: the function's
  own names for the table's arguments (each must be one of its parameters).
- `fn.layout = "bnhd"` (attention, linear attention): the tensors are passed, and `o` read
  back, as `[B, N, H, D]` (permuted views of the drawn tensors: the strided-layout fuzzing
  stays, in that layout; `contiguous` limits mean contiguous in it). `lse` stays `[B, H, Nq]`.
- `fn.returns = ("o",)`: the outputs it returns, in the table's order. The checks that need
  another one (attention's key-split merges need `lse`) are not applicable; the others
  compare what it returns.
"""

LIMITS = """\
## Declared limits

A kernel that refuses part of the domain on purpose says which part with `fn.limits`
(validated when the implementation is loaded: an unknown key, dim or argument, or a
bad value, is an error that names the fix). The strategies then draw inside the
limits, so the kernel gets its full share of examples; a check that needs cases the
limits exclude (a causal-only kernel and a bidirectional property) is skipped with
that reason. Keys:
"""


def contract_markdown() -> str:
    ops = registry.load()
    out = ["# The op contract", "",
           "<!-- generated by `python -m tritoncheck.contract --write` from the registry; do not edit -->", "",
           RULES, "| op | signature | shapes and meaning | dtypes | autograd |", "|---|---|---|---|---|"]
    for name in sorted(ops):
        op = ops[name]
        grads = ", ".join(f"`{g}`" for g in op.grad_inputs) or "none required"
        if op.grad_inputs and op.grad_outputs != op.outputs:
            grads += " through " + ", ".join(f"`{o}`" for o in op.grad_outputs)
        out.append(f"| `{name}` | `{op.signature}` | {op.meaning} | {_dtypes(op)} | {grads} |")
    out += ["", CALLING, REFUSALS, LIMITS]
    out += [f"- `{key}`: {text}" for key, text in limits.KEYS.items()]
    out += ["", "Named dims and the scalar arguments a limit can narrow, per op:", "",
            "| op | dims (tensor, axis) | `values` may narrow |", "|---|---|---|"]
    for name in sorted(ops):
        op = ops[name]
        dims = ", ".join(f"`{d}` ({t}, {a})" for d, (t, a) in op.dims.items()) or "none"
        choices = ", ".join(f"`{a}` from {list(v)}" for a, v in op.choices.items()) or "none"
        out.append(f"| `{name}` | {dims} | {choices} |")
    out += ["", "## An op's own declarations", "",
            "Beside the generic attributes (`tritoncheck/declarations.py` ATTRIBUTES), an implementation may set "
            "the declarations its op's record lists (`OpSpec.declarations`); one listed by other ops only is an "
            "error.", "", "| op | declaration | meaning |", "|---|---|---|"]
    for name in sorted(ops):
        for d in ops[name].declarations:
            out.append(f"| `{name}` | `{d.name}` | {d.meaning} |")
    out += ["", "Example (a flash attention that takes head dims 64 and 128, causal only, sequences up to",
            "16384, contiguous inputs):", "", "```python",
            'flash_attention.limits = {"sizes": {"D": (64, 128)}, "values": {"causal": (True,)},',
            '                          "max_size": {"Nq": 16384, "Nk": 16384}, "contiguous": True}', "```", ""]
    return "\n".join(out)


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def _is_generic(check) -> bool:
    return check.run is getattr(generic, check.name, None)


def checks_markdown() -> str:
    from tritoncheck import selfcheck  # imports every mutant module: only where the page is made
    ops = registry.load()
    killers: dict[tuple[str, str], list[str]] = {}
    for m in selfcheck.mutants():
        for check in m.kills:
            killers.setdefault((m.op, check), []).append(m.name)

    def planted(op: str, check: str) -> str:
        names = killers.get((op, check), [])
        return ("planted bugs: " + ", ".join(f"`{n}`" for n in names)) if names else "no planted bug of this op"

    out = ["# Checks by op", "",
           "<!-- generated by `python -m tritoncheck.contract --write` from the registry; do not edit -->", "",
           "Every check of every op, from the op records (`properties/<family>.py`): what it asserts (the",
           "first paragraph of its docstring; the rest, with the derivation of its allowance, is in the",
           "source), the planted bugs (`mutants/`) that the self-test requires it to fail, and the correct",
           "plain-PyTorch controls (`controls/`) that must pass every check. Signatures, shapes and dtypes:",
           "[the op contract](contract.md).", "", "## Checks every op gets", ""]
    for check in generic.generic_checks(True):
        out.append(f"- **`{check.name}`**: {_first_paragraph(check.doc)}")
    out += ["", "`gradients_match_reference` and `backward_repeatable` apply to ops with autograd inputs.", ""]
    for name in sorted(ops):
        op = ops[name]
        controls = ", ".join(f"`{c}`" for c in op.controls) or "none"
        out += [f"## `{name}`", "", f"`{op.signature}`; controls: {controls}.", ""]
        for check in op.checks:
            if _is_generic(check):
                out.append(f"- `{check.name}` ({planted(name, check.name)})")
            else:
                out.append(f"- **`{check.name}`**: {_first_paragraph(check.doc)} "
                           f"*{planted(name, check.name).capitalize()}.*")
        out.append("")
    return "\n".join(out)


def ops_line() -> str:
    ops = registry.load()
    return (f"{len(ops)} ops: " + ", ".join(f"`{name}`" for name in sorted(ops))
            + " ([the contract](docs/contract.md)).")


def attributes_table() -> str:
    rows = ["| attribute | what it declares |", "|---|---|"]
    rows += [f"| `{name}` | {text} |" for name, text in declarations.ATTRIBUTES.items()]
    return "\n".join(rows)


PAGES = {"docs/contract.md": contract_markdown, "docs/checks-by-op.md": checks_markdown}
BLOCKS = {("README.md", "ops"): ops_line, ("docs/declarations.md", "attributes"): attributes_table}


def with_block(text: str, name: str, body: str) -> str:
    """``text`` with the block ``name`` (between its start and end markers) replaced by ``body``."""
    start, end = f"<!-- generated:{name}:start -->", f"<!-- generated:{name}:end -->"
    head, found, rest = text.partition(start)
    if not found or end not in rest:
        raise ValueError(f"no {start} ... {end} markers")
    return f"{head}{start}\n{body}\n{end}{rest.partition(end)[2]}"


def generated() -> dict[str, str]:
    """Path (relative to the checkout) -> its text as generated from the current records."""
    out = {path: make() for path, make in PAGES.items()}
    for (path, name), make in BLOCKS.items():
        out[path] = with_block(out.get(path) or (ROOT / path).read_text(), name, make())
    return out


def stale() -> list[str]:
    """The generated files whose committed text differs from what the records give."""
    return [path for path, text in generated().items()
            if not (ROOT / path).is_file() or (ROOT / path).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tritoncheck.contract")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="write every generated page and block")
    action.add_argument("--check", action="store_true", help="exit 1 when a generated page or block is stale")
    args = parser.parse_args(argv)
    backend.select("interpret")  # listing needs no GPU
    if args.write:
        for path, text in generated().items():
            (ROOT / path).write_text(text)
    elif args.check:
        paths = stale()
        if paths:
            print(f"stale: {', '.join(paths)}; run `python -m tritoncheck.contract --write`")
            return 1
    else:
        print(markdown_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
