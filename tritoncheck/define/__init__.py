"""Define an op of your own: its signature, its fp64 reference, and nothing else.

The public names are re-exported by ``tritoncheck`` itself (``tritoncheck.op``,
``tritoncheck.Tensor``, ...); docs/your-op.md is the guide.
"""
