"""The contract table, generated from the registry so it cannot drift from the code.

``python -m properties.contract`` prints it (the README's copy is this output);
``pytest --list-ops`` prints the same.
"""
from __future__ import annotations

from properties import backend, registry


def markdown_table() -> str:
    ops = registry.load()
    lines = ["| op | signature | dtypes | autograd | checks |", "|---|---|---|---|---|"]
    for name in sorted(ops):
        op = ops[name]
        dtypes = ", ".join(str(d).replace("torch.", "") for d in op.dtypes)
        grads = ", ".join(op.grad_inputs) or "none"
        checks = ", ".join(f"`{c.name}`" for c in op.checks)
        lines.append(f"| `{name}` | `{op.signature}` | {dtypes} | {grads} | {checks} |")
    return "\n".join(lines)


def main() -> None:
    backend.select("interpret")  # listing needs no GPU
    print(markdown_table())


if __name__ == "__main__":
    main()
