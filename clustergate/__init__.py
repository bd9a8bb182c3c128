"""clustergate: a pytest-based acceptance suite for GPU clusters.

This package is the pytest plugin named ``clustergate``, loaded only where a run asks for it: the
acceptance suite's conftest, ``-p clustergate``, ``--clustergate`` or the ini key ``clustergate = true``
(``clustergate.optin``, the ``pytest11`` entry point, adds only that switch to every pytest run);
``-p no:clustergate`` keeps it off. Registering it registers its hook modules: the distributed session
and judging (``clustergate.run.plugin``) and the sign-off report (``clustergate.report.hooks``). Importing the
package imports neither: the ``clustergate`` command (``clustergate.cli``) and the report work without torch.

Importing it also puts ``clustergate.trust.source_import`` first among Python's importers: every module of the suite
imported after this one is compiled from its source's bytes, never from a ``__pycache__`` file beside it.
"""

from clustergate.trust import source_import

source_import.install()

__version__ = "0.1.0"

pytest_plugins = ("clustergate.run.plugin", "clustergate.report.hooks")
