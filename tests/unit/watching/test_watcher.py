"""Which roots get inotify and which get polled."""

from __future__ import annotations

from pathlib import Path

from trainsentry.watching.kernel import filesystem_type

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,relatime 0 0
lustre@tcp:/fs /lustre lustre rw 0 0
sshfs#host: /home/me/remote fuse.sshfs rw 0 0
tmpfs /mnt/shared/scratch tmpfs rw 0 0
"""


def mounts(tmp_path: Path) -> str:
    path = tmp_path / "mounts"
    path.write_text(MOUNTS)
    return str(path)


def test_longest_mount_prefix_decides_the_filesystem(tmp_path: Path) -> None:
    table = mounts(tmp_path)
    assert filesystem_type(Path("/mnt/shared/runs/exp1"), table) == "nfs4"
    assert filesystem_type(Path("/mnt/shared/scratch/x"), table) == "tmpfs"
    assert filesystem_type(Path("/lustre/project"), table) == "lustre"
    assert filesystem_type(Path("/home/me/remote/logs"), table) == "fuse.sshfs"
    assert filesystem_type(Path("/srv/logs"), table) == "ext4"


def test_a_mount_point_is_not_a_prefix_of_a_sibling_name(tmp_path: Path) -> None:
    assert filesystem_type(Path("/lustre2/x"), mounts(tmp_path)) == "ext4"


def test_unreadable_mount_table_means_unknown(tmp_path: Path) -> None:
    assert filesystem_type(Path("/x"), str(tmp_path / "missing")) == "unknown"
