"""``python -m tritoncheck``: the ``tritoncheck`` command (tritoncheck/cli.py)."""
from tritoncheck.cli import main

raise SystemExit(main())
