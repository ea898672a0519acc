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
"""

from __future__ import annotations

import os

__all__ = ["PROC_LOCKS", "other_process_attached"]

PROC_LOCKS = "/proc/locks"


def other_process_attached(path: str, *, locks_file: str = PROC_LOCKS) -> bool:
    """Whether a process other than this one may have the SQLite file ``path`` open (in
    WAL mode, with a connection of this process open on it too); True when it cannot be
    told (module docstring)."""
    try:
        shm = os.stat(path + "-shm")
        with open(locks_file, encoding="ascii", errors="replace") as file:
            listing = file.read()
    except OSError:
        return True
    # The kernel's format: "<id>: POSIX ADVISORY READ <pid> <major>:<minor>:<inode> <start>
    # <end>", device numbers in hex ("%02x"); blocked waiters have "->" after the id.
    device = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    me = str(os.getpid())
    mine = False
    for line in listing.splitlines():
        if device not in line:
            continue
        fields = line.split()
        try:
            at = fields.index(device)
        except ValueError:
            continue
        if at == 0 or fields[at - 1] != me:
            return True  # another process's (or one it cannot name: pid 0 or -1)
        mine = True
    return not mine
