"""What merge and sign-off keep in the results store (``--store``, else ``$CLUSTERGATE_STORE``): every finished
run they read, then the document they write. Recording is idempotent (a node run that recorded itself is already
there) and never changes a verdict: a file that cannot be recorded is a warning, a store that cannot be used one
line naming it and how to record later."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from clustergate.record.resultsfile import ResultsFileError
from clustergate.store import DocumentError, Store, StoreError


def record_inputs(store: Store | None, paths: Iterable[Path]) -> list[str]:
    """Record each results file of ``paths`` (runs the command read); a warning for each one that could not be,
    and a single one for a store that cannot be used at all."""
    if store is None:
        return []
    warnings = []
    for path in paths:
        try:
            store.record_file(path)
        except (DocumentError, ResultsFileError) as exc:  # this file
            warnings.append(f"not recorded in the results store: {exc}")
        except StoreError as exc:  # the store itself: no later file would fare better
            return [*warnings, f"not recorded in the results store: {exc}"]
    return warnings


def record_output(store: Store | None, path: Path) -> str | None:
    """Record the document the command wrote; the line that says what happened (None without a store)."""
    if store is None:
        return None
    try:
        done = store.record_file(path)
    except (StoreError, ResultsFileError) as exc:
        return (f"not recorded in the results store: {exc}; record it later: clustergate record {path} --store "
                f"{store.path}")
    return f"{'recorded in' if done.new else 'already in'} the store {store.path} as #{done.run}"
