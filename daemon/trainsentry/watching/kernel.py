"""What the kernel says about watching: watches held, the per-user limit, filesystem types.

The kernel's watch limit (fs.inotify.max_user_watches, shared by every
process of the user) is the trap: a recursive watch fails loudly only for the
root and leaves sub-directories it could not add unwatched. So the watches are
counted from the kernel (/proc/self/fdinfo) and compared with the directories
a sweep walked; a root short of watches is polled instead, with one warning
that says how to raise the limit. On network filesystems a write from another
host raises no event on this one, so such roots are always polled.
"""

from __future__ import annotations

import os
from pathlib import Path

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs",
     "beegfs", "panfs", "afs", "wekafs", "virtiofs"}
)  # fmt: skip

WATCH_LIMIT_FILE = Path("/proc/sys/fs/inotify/max_user_watches")


def inotify_watches(proc: Path = Path("/proc/self")) -> int | None:
    """inotify watches this process holds, from the kernel; None where /proc cannot tell.

    watchdog does not say how many watches it holds; the kernel does, as one
    `inotify wd:` line per watch in the fdinfo of each inotify descriptor.
    """
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        return None
    total = 0
    for fd in fds:
        try:
            if os.readlink(proc / "fd" / fd) != "anon_inode:inotify":
                continue
            with open(proc / "fdinfo" / fd, encoding="ascii", errors="replace") as f:
                total += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:  # closed between listing and reading
            continue
    return total


def inotify_watch_limit(path: Path = WATCH_LIMIT_FILE) -> int | None:
    """The per-user limit (shared with every process of the same user)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def watch_shortfall(directories: int, watches: int | None) -> int:
    """Directories left without a watch: 0 when the count is unknown or enough.

    One watch per directory is what a recursive watch needs; more watches than
    directories is normal (the daemon skips .git and its own control
    directories, watchdog does not), so only a shortfall means a deaf subtree.
    """
    if watches is None or watches >= directories:
        return 0
    return directories - watches


def limit_advice(limit: int | None, directories: int | None = None) -> str:
    """The sysctl line that would make room, with headroom for growth and other processes."""
    current = limit or 8192
    wanted = max(2 * current, current + 2 * (directories or 0), 524288)
    return (
        f"raise it with `sysctl fs.inotify.max_user_watches={wanted}` "
        "(persist it in /etc/sysctl.d/) and restart trainsentry"
    )


def filesystem_type(path: Path, mounts: str = "/proc/mounts") -> str:
    """The type of the filesystem `path` lives on, from the longest mount prefix."""
    target = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, parts[2]
    except OSError:
        pass
    return fstype


def needs_polling(path: Path) -> bool:
    fstype = filesystem_type(path)
    return fstype in NETWORK_FS or fstype.startswith("fuse")
