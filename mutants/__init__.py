"""Planted bugs as data: one module per op family, each a list of :func:`tritoncheck.mutation.mutant`
records (a project kernel, one source patch, and the checks that must kill it)."""
