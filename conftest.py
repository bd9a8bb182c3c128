"""Enable the clustergate plugin for this checkout (acceptance/ runs on every torchrun rank)."""

pytest_plugins = ["clustergate.plugin", "clustergate.report.hooks"]
