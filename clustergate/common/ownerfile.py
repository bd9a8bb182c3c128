"""A lock held by the file that names its holder: made with ``O_CREAT | O_EXCL`` (NFS v3 and later create a file
exclusively on the server, so of two hosts that try at once exactly one makes it), removed by its holder when
done. Where no kernel lock can be had: the run lock's fallback where flock does not work, and the store's lock.

Who may judge a holder gone (stale) is its user's rule: the file only says who wrote it, and ``remove_stale``
takes it away without removing a newer holder's.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


class OwnerFile:
    """``path``, made by one process at a time (``take``); ``mode``: the file's permissions."""

    def __init__(self, path: Path, mode: int = 0o600) -> None:
        self.path = path
        self.mode = mode
        self.ino: int | None = None
        """The inode of the file this process made (None while it holds none): what ``release`` removes."""

    @property
    def held(self) -> bool:
        return self.ino is not None

    def take(self, holder: str) -> bool:
        """Make the file with ``holder`` in it: True once held, False where it exists (another holds it, or held
        it); an OSError where it cannot be made. A link under its name is never followed."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self.mode)
        except FileExistsError:
            return False
        try:
            os.write(fd, holder.encode())
            self.ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        return True

    def holder(self) -> tuple[str, os.stat_result]:
        """What the file another process made says of its holder (stripped; "" while being written) and its stat
        (inode, when it was written); FileNotFoundError where it is gone meanwhile, an OSError (ELOOP: a link)
        where it cannot be read."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            text = os.read(fd, 512).decode(errors="replace").strip()
        finally:
            os.close(fd)
        return text, st

    def remove_stale(self, ino: int) -> None:
        """Remove the stale file (inode ``ino`` when it was judged stale), unless another process has replaced it
        meanwhile: of two that judged it stale, one moves it aside; a lock made after it was read goes back (a hard
        link never replaces a newer one)."""
        aside = self.path.with_name(f"{self.path.name}.stale-{secrets.token_hex(6)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        with contextlib.suppress(OSError):
            if os.lstat(aside).st_ino != ino:
                os.link(aside, self.path)
        with contextlib.suppress(OSError):
            os.unlink(aside)

    def release(self) -> None:
        """Remove the file this process made (not one another made since); nothing where it holds none."""
        if self.ino is None:
            return
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self.ino:
                os.unlink(self.path)
        self.ino = None
