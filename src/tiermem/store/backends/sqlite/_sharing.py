"""Whether another process has a SQLite file open: :func:`other_process_attached`.

Why: a process writing directly, back to back, leaves the file's write lock alone for a
moment every few writes, so that a writer of another process, which waits in SQLite's
busy handler and holds nothing meanwhile, can get in (see
:mod:`~tiermem.store.backends.sqlite._connection`). Leaving that gap costs a thread
hand-off, and it is owed only when another process can be waiting at all: one that has
the file open.

How: in WAL mode every connection of SQLite's unix VFS keeps a shared POSIX lock on a
byte of the ``-shm`` file for as long as it has the file open (the "dead man switch"
that tells the last process out), and Linux lists every POSIX lock, with the process
holding it, in ``/proc/locks``. Read-only: the ``-shm`` file itself is never opened here,
since closing any descriptor of a file drops every POSIX lock the process holds on it.

The answer is "attached" whenever it cannot be told: no ``/proc/locks`` (not Linux), no
``-shm`` file, or no lock of this very process found on it (a file system whose locks
are listed under another device or inode, as an overlay may do); a lock whose process
the listing cannot name (pid 0: another PID namespace) counts as another process's. So
a wrong "attached" costs only the gaps being left as before. A wrong "alone" is possible
where a kernel leaves other PID namespaces' locks out of the listing (some older ones
did): a writer in another container on a shared volume is then seen only once a direct
write finds the file busy, which turns the gaps on for
:data:`~tiermem.store.backends.sqlite._worker.CONTENDED_FOR` as before.

Cost: the kernel lists every lock of the host, a page per ``read`` call, walking the list
from its start on each call, so reading the whole listing grows with the square of its
length (20,000 locks: about 1.2 MB and 44 ms). Only the first :data:`MAX_LISTING_BYTES`
are read (about 1,000 locks; under 1 ms even then); a longer listing answers "attached",
as any listing that cannot be told. The caller runs this on its event loop, so it must
never raise either: any failure to read is "attached" too.
"""

from __future__ import annotations

import os

__all__ = ["MAX_LISTING_BYTES", "PROC_LOCKS", "other_process_attached"]

PROC_LOCKS = "/proc/locks"
MAX_LISTING_BYTES = 64 * 1024
"""How much of the lock listing is read at most (module docstring): some 1,000 locks of
about 60 bytes. Reading it took 0.7 ms with 20,000 locks on the host, 11 µs with 10."""


def other_process_attached(
    path: str, *, locks_file: str = PROC_LOCKS, max_bytes: int = MAX_LISTING_BYTES
) -> bool:
    """Whether a process other than this one may have the SQLite file ``path`` open (in
    WAL mode, with a connection of this process open on it too); True when it cannot be
    told: no listing, one longer than ``max_bytes``, or any failure to read it (module
    docstring). Never raises an ``OSError`` or ``ValueError``."""
    try:
        shm = os.stat(path + "-shm")
        listing = _read_listing(locks_file, max_bytes)
    except (OSError, ValueError):
        return True
    if listing is None:
        return True  # longer than max_bytes: the rest is unread
    # The kernel's format: "<id>: POSIX ADVISORY READ <pid> <major>:<minor>:<inode> <start>
    # <end>", device numbers in hex ("%02x"); blocked waiters have "->" after the id.
    device = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    me = str(os.getpid())
    mine = False
    # Only the lines naming the file are split (found with str.find, not line by line).
    at = listing.find(device)
    while at >= 0:
        start = listing.rfind("\n", 0, at) + 1
        end = listing.find("\n", at)
        line = listing[start : len(listing) if end < 0 else end]
        fields = line.split()
        if device in fields:
            where = fields.index(device)
            if where == 0 or fields[where - 1] != me:
                return True  # another process's (or one it cannot name: pid 0 or -1)
            mine = True
        if end < 0:
            break
        at = listing.find(device, end)
    return not mine


def _read_listing(locks_file: str, max_bytes: int) -> str | None:
    """The lock listing, or None when it is longer than ``max_bytes``.

    Raises:
        OSError: it cannot be opened or read.
    """
    chunks: list[bytes] = []
    size = 0
    fd = os.open(locks_file, os.O_RDONLY)
    try:
        while size <= max_bytes:
            # A page a call from /proc; a plain file may give it all at once.
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        return None
    return b"".join(chunks).decode("ascii", errors="replace")
