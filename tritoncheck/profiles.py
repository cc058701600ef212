"""The profiles' example counts, one number each: the plugin registers the Hypothesis
profiles with them (tritoncheck/plugin.py says why each is what it is) and the command's
``--help`` quotes them. Importing this imports nothing else (``--help`` stays fast)."""

EXAMPLES = {"quick": 10, "dev": 20, "ci": 10, "gpu": 100, "nightly": 1000}
PROFILES = tuple(EXAMPLES)  # quick, dev, ci, gpu, nightly
