"""clustergate: a pytest-based acceptance suite for GPU clusters.

This package is the pytest plugin named ``clustergate``, loaded only where a run asks for it: the
acceptance suite's conftest, ``-p clustergate``, ``--clustergate`` or the ini key ``clustergate = true``
(``clustergate.optin``, the ``pytest11`` entry point, adds only that switch to every pytest run);
``-p no:clustergate`` keeps it off. Registering it registers its hook modules: the distributed session
and judging (``clustergate.run.plugin``) and the sign-off report (``clustergate.report.hooks``). Importing the
package imports neither: the ``clustergate`` command (``clustergate.cli``) and the report work without torch.
"""

__version__ = "0.1.0"

pytest_plugins = ("clustergate.run.plugin", "clustergate.report.hooks")
