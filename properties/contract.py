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


START, END = "<!-- contract:start -->", "<!-- contract:end -->"


def readme_with_table(text: str) -> str:
    """``text`` (the README) with the table between its markers replaced by the current one."""
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{markdown_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> None:
    import argparse
    from pathlib import Path
    parser = argparse.ArgumentParser(prog="python -m properties.contract")
    parser.add_argument("--write-readme", action="store_true", help="refresh the table in README.md")
    args = parser.parse_args(argv)
    backend.select("interpret")  # listing needs no GPU
    if args.write_readme:
        readme = Path(__file__).resolve().parents[1] / "README.md"
        readme.write_text(readme_with_table(readme.read_text()))
    else:
        print(markdown_table())


if __name__ == "__main__":
    main()
