"""The checkout's pytest wiring is tritoncheck's plugin (``tritoncheck/plugin.py``), loaded here
when no installed entry point loaded it already (a run from a checkout that was never
installed, as on the GPU machine); ``pyproject.toml`` activates it for the checkout."""
pytest_plugins = ["tritoncheck.plugin"]
