"""The suite: registry, strategies, tolerances and properties for Triton kernels.

Public entry points: :func:`properties.registry.register_implementation` (test your
own kernel), ``python -m properties.replay FILE`` (replay a failing case) and
``python -m properties.contract`` (the contract table).
"""
