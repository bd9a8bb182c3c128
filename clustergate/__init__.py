"""clustergate: a pytest-based acceptance suite for GPU clusters.

This package is the pytest plugin named ``clustergate`` (the ``pytest11`` entry point in
pyproject.toml; ``-p no:clustergate`` turns it off, ``-p clustergate`` turns it on where plugins
do not autoload). Registering it registers its hook modules: the distributed session and judging
(``clustergate.plugin``) and the sign-off report (``clustergate.report.hooks``). Importing the
package imports neither: the report command works without torch.
"""

__version__ = "0.1.0"

pytest_plugins = ("clustergate.plugin", "clustergate.report.hooks")
