"""Per-op specs, tolerance rules and checks: one family module registers its ops with
:func:`tritoncheck.registry.register` (``tritoncheck.properties.<family>`` once installed)."""
