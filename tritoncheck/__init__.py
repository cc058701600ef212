"""The one name the distribution installs.

``pip install -e .`` used to install the checkout's folders (``kernels``,
``properties``, ``mutants``, ``controls``, ``references``) as top-level packages,
which shadowed (or were shadowed by) a user's own modules of those names. The
distribution now installs ``tritoncheck`` alone, with those folders as its
subpackages (``tritoncheck.kernels`` is ``kernels/``, mapped by ``package-dir`` in
``pyproject.toml``), so nothing else lands in site-packages.

The suite runs from its checkout: pytest from the repository root puts the root on
``sys.path``, where the folders import by their own names (``from properties import
...``), as every module and the README's commands do.
"""
__version__ = "0.1.0"
