"""Enable the clustergate plugin for this checkout (acceptance/ runs on every torchrun rank).

Where the package is installed, its pytest11 entry point has already registered the plugin under
the name ``clustergate`` and this is a no-op; ``-p no:clustergate`` blocks both.
"""

pytest_plugins = ["clustergate"]
