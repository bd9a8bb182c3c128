import os
import time
from pathlib import Path

# Rank 0 says it has loaded its conftest: from here it goes straight to the start's exchange, where it waits for
# rank 1 (the harness times its wait from this file, not from rank 1's, which may come earlier on busy cores).
if os.environ["RANK"] == "0":
    Path("loaded-0").write_text(str(os.getpid()))
if os.environ["RANK"] == "1":  # rank 1 is loading this conftest, before the plugin has set anything up
    Path("stuck-1").write_text(str(os.getpid()))
    time.sleep(70)
