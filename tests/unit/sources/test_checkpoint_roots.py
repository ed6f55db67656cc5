"""Checkpoint roots read as a series (sources/checkpoints.py): what is a checkpoint, when it
is complete or partial, which run it is of, and the bounds a hostile root meets."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainsentry.sources import checkpoints as ck
from trainsentry.sources.checkpoint_files import (
    checkpoint_file,
    folder_by_name,
    named_step,
    root_of,
    use_names,
    woken_root,
)
from trainsentry.sources.discover import Root, is_log, store_of
from trainsentry.sources.following import follow
from trainsentry.sources.reading import iter_batches
from trainsentry.state.db import Checkpoint

HOUR_AGO = time.time() - 3600


def write(path: Path, size: int = 100, at: float | None = HOUR_AGO) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if at is not None:
        os.utime(path, (at, at))
    return path


def age(*paths: Path, at: float = HOUR_AGO) -> None:
    """Set mtimes, folders after their files (a file made in a folder moves its mtime)."""
    for path in sorted(paths, key=lambda p: -len(p.parts)):
        for inner in sorted(path.rglob("*"), key=lambda p: -len(p.parts)) if path.is_dir() else ():
            os.utime(inner, (at, at), follow_symlinks=False)
        os.utime(path, (at, at), follow_symlinks=False)


def hf(root: Path, step: int, size: int = 1000, state: bool = True) -> Path:
    folder = root / f"checkpoint-{step}"
    write(folder / "model.safetensors", size)
    write(folder / "optimizer.pt", 2 * size)
    if state:
        write(folder / "trainer_state.json", 10)
    age(folder)
    return folder


def told(root: Path) -> list[tuple[str, str, int, float]]:
    """(run, tag, step, value) of every point a replay reads under `root`."""
    return [(p.run, p.tag, p.step, p.value) for b in iter_batches([root]) for p in b]


def steps_of(got: list[tuple[str, str, int, float]], tag: str = ck.STEP_TAG) -> list[int]:
    return [s for _, t, s, _ in got if t == tag]


def tail_at(root: Path, given: Path | None = None) -> ck.CheckpointTail:
    log = Root.watched(given or root.parent).checkpoints(root)
    tail = follow(log)
    assert isinstance(tail, ck.CheckpointTail)
    return tail


# -- names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("epoch=0-step=100.ckpt", "100"),
        ("epoch=3-step=1200-val_loss=0.52.ckpt", "1200"),
        ("epoch=0-step=100-v1.ckpt", "100"),
        ("ckpt_1000.pt", "1000"),
        ("model_step1000.pth", "1000"),
        ("step-1000.pt", "1000"),
        ("checkpoint_7", "7"),
        ("last.ckpt", None),
        ("last-v1.ckpt", None),
        ("model.pt", None),
        ("epoch_3.pt", None),
        ("1000.pt", None),
        ("events.out.tfevents.1.host", None),
        ("metrics.jsonl", None),
    ],
)
def test_a_file_is_a_checkpoint_by_a_step_in_its_name(name: str, step: str | None) -> None:
    assert checkpoint_file(name) == step


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-500", "500"),
        ("global_step100", "100"),
        ("iter_0000100", "0000100"),
        ("checkpoint_3", "3"),
        ("tmp-checkpoint-500", "500"),
        ("100.orbax-checkpoint-tmp-1712", "100"),
        ("step_300.tmp", "300"),
        ("runs", None),
        ("step_300", None),  # named with a step, but a checkpoint only by what it holds
        ("version_0", None),
    ],
)
def test_a_folder_is_a_checkpoint_by_its_framework_name(name: str, step: str | None) -> None:
    assert folder_by_name(name) == step


@pytest.mark.parametrize(
    ("name", "step"),
    [("step_300", "300"), ("300", "300"), ("run_1", None), ("epoch_3", None), ("v2", None)],
)
def test_a_step_in_a_name_follows_a_word_that_says_so(name: str, step: str | None) -> None:
    assert named_step(name) == step


def test_a_file_names_its_root_by_its_path_alone(tmp_path: Path) -> None:
    top = tmp_path
    assert root_of(top / "out/checkpoint-5/model.safetensors", top) == top / "out"
    assert root_of(top / "lt/version_0/checkpoints/epoch=0-step=9.ckpt", top) == (
        top / "lt/version_0/checkpoints"
    )
    assert root_of(top / "dcp/step_300/.metadata", top) == top / "dcp"
    assert root_of(top / "ob/400/_CHECKPOINT_METADATA", top) == top / "ob"
    assert root_of(top / "ob/400/default/d/abc", top) is None  # told by its metadata file
    assert root_of(top / "exp/5/model.pt", top) is None  # a bare number takes metadata only
    assert root_of(top / "exp/metrics.jsonl", top) is None
    assert root_of(top / "checkpoint-5/model.safetensors", top / "checkpoint-5") is None
    assert woken_root(str(top / "out/checkpoint-5/model.safetensors")) == str(top / "out")
    assert store_of(str(top / "out/checkpoint-5/optimizer.pt")) == str(top / "out")
    assert is_log(str(top / "out/checkpoint-5/optimizer.pt"))


# -- what is told ------------------------------------------------------------------------


def test_each_framework_layout_is_a_series_on_its_run(tmp_path: Path) -> None:
    top = tmp_path / "logs"
    for step in (10, 20):
        hf(top / "hf", step)
    write(top / "hf/runs/Jan01_host/events.out.tfevents.1.host", 0)
    lt = top / "lt/version_0/checkpoints"
    write(lt / "epoch=0-step=100.ckpt", 500)
    write(lt / "last.ckpt", 500)
    for step in (5, 6):
        write(top / f"ds/global_step{step}/mp_rank_00_model_states.pt", 50)
    write(top / "ds/latest", 0).write_text("global_step6\n")
    write(top / "mg/checkpoints/iter_0000100/mp_rank_00/model_optim_rng.pt", 70)
    write(top / "mg/checkpoints/latest_checkpointed_iteration.txt", 0).write_text("100")
    write(top / "dcp/checkpoints/step_300/__0_0.distcp", 30)
    write(top / "dcp/checkpoints/step_300/.metadata", 3)
    write(top / "ob/ckpts/400/_CHECKPOINT_METADATA", 4)
    write(top / "ob/ckpts/400/default/d/0", 40)
    write(top / "pt/ckpt_1000.pt", 80)
    write(top / "st/checkpoints/step_7/model.safetensors", 9)
    age(top)
    got = told(top)
    assert sorted({(run, step) for run, tag, step, _ in got if tag == ck.STEP_TAG}) == [
        ("logs/dcp", 300),
        ("logs/ds", 5),
        ("logs/ds", 6),
        ("logs/hf", 10),
        ("logs/hf", 20),
        ("logs/lt/version_0", 100),  # Lightning's checkpoints/ is its run's, last.ckpt no save
        ("logs/mg", 100),
        ("logs/ob", 400),
        ("logs/pt", 1000),
        ("logs/st", 7),
    ]
    sizes = {(r, s): v for r, t, s, v in got if t == ck.BYTES_TAG}
    assert sizes[("logs/hf", 10)] == 3010 and sizes[("logs/ob", 400)] == 44
    files = {(r, s): v for r, t, s, v in got if t == ck.FILES_TAG}
    assert files[("logs/hf", 10)] == 3
    assert {v for _, t, _, v in got if t == ck.PARTIAL_TAG} == {0.0}


def test_a_checkpoint_is_stamped_with_its_completion(tmp_path: Path) -> None:
    root = tmp_path / "out"
    folder = hf(root, 10)
    at = HOUR_AGO + 12.5
    os.utime(folder / "trainer_state.json", (at, at))
    got = tail_at(root).read()
    assert [(r.step, r.wall_time) for r in got.rows if ck.STEP_TAG in r.tags] == [(10, at)]


def test_a_folder_missing_its_last_file_is_partial_long_after_and_pending_before(
    tmp_path: Path,
) -> None:
    root = tmp_path / "out"
    hf(root, 10)
    hf(root, 20, state=False)  # the Trainer died before trainer_state.json
    fresh = write(root / "checkpoint-30/model.safetensors", 5, at=None)
    got = told(root)
    assert steps_of(got) == [10]
    assert [(s, v) for _, t, s, v in got if t == ck.PARTIAL_TAG] == [(10, 0.0), (20, 1.0)]
    assert fresh.exists()  # checkpoint-30 is being written: neither told nor partial yet


def test_a_staged_save_left_behind_is_partial(tmp_path: Path) -> None:
    root = tmp_path / "ob"
    write(root / "100.orbax-checkpoint-tmp-17/_CHECKPOINT_METADATA", 4)
    write(root / "tmp-checkpoint-200/model.safetensors", 4)
    write(root / "checkpoint-300/trainer_state.json", 4)
    write(root / "checkpoint-300/model.safetensors.tmp", 4)
    age(root)
    got = told(root)
    assert [(s, v) for _, t, s, v in got if t == ck.PARTIAL_TAG] == [
        (100, 1.0),
        (200, 1.0),
        (300, 1.0),
    ]


def test_deepspeed_folders_wait_for_their_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(ck, "time", SimpleNamespace(time=clock.time, monotonic=clock.monotonic))
    root = tmp_path / "ds"
    for step in (5, 6):
        write(root / f"global_step{step}/model.pt", 10)
    pointer = write(root / "latest", 0)
    pointer.write_text("global_step5")
    age(root)
    age(root / "global_step6", at=time.time() - 2 * ck.SETTLE_SECONDS)  # settled, not yet named
    tail = tail_at(root)
    got = tail.read()
    assert [r.step for r in got.rows if ck.STEP_TAG in r.tags] == [5]
    assert got.again_in is not None  # global_step6 is looked at again
    pointer.unlink()
    os.symlink("global_step6", root / "latest")  # a symlinked pointer: read, never followed
    woken = tail.read()  # at once: a checkpoint being written is looked into once a second
    assert woken.rows == [] and woken.again_in == pytest.approx(ck.LOOK_EVERY)
    clock.now += ck.LOOK_EVERY
    assert [r.step for r in tail.read().rows if ck.STEP_TAG in r.tags] == [6]


class Clock:
    """time.time and time.monotonic of the tail, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def test_a_checkpoint_is_told_once_it_has_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(ck, "time", SimpleNamespace(time=clock.time, monotonic=clock.monotonic))
    root = tmp_path / "lt/checkpoints"
    # its writer's clock is a minute ahead of ours (a network filesystem): never "old"
    ahead = clock.now + 60
    write(root / "epoch=0-step=10.ckpt", 100, at=ahead)
    tail = tail_at(root)
    first = tail.read()
    assert first.rows == [] and first.again_in == pytest.approx(ck.SETTLE_SECONDS)
    clock.now += ck.SETTLE_SECONDS / 2
    assert tail.read().rows == []
    clock.now += ck.SETTLE_SECONDS / 2
    got = tail.read()
    assert [r.step for r in got.rows if ck.STEP_TAG in r.tags] == [10]
    assert got.again_in is None
    clock.now += ck.FREE_SECONDS
    assert [r.tags for r in tail.read().rows] == [ck.ROOM_TAGS]  # nothing told twice


def test_a_checkpoint_that_grows_is_not_told_until_it_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(ck, "time", SimpleNamespace(time=clock.time, monotonic=clock.monotonic))
    root = tmp_path / "pt"
    path = write(root / "ckpt_10.pt", 100, at=clock.now)
    tail = tail_at(root)
    assert tail.read().rows == []
    clock.now += ck.SETTLE_SECONDS - 1
    write(path, 200, at=clock.now)  # still written
    assert tail.read().rows == []
    clock.now += ck.SETTLE_SECONDS
    assert [r.values[1] for r in tail.read().rows if ck.STEP_TAG in r.tags] == [200.0]


def test_the_room_left_is_free_space_over_the_newest_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "out"
    hf(root, 10, size=1000)
    got = tail_at(root).read()
    [room] = [r for r in got.rows if r.tags == ck.ROOM_TAGS]
    free, fits = room.values
    fs = os.statvfs(root)
    assert room.step == 10 and free == pytest.approx(fs.f_bavail * fs.f_frsize, rel=0.05)
    assert fits == pytest.approx(free / 3010)


# -- bounds ----------------------------------------------------------------------------


def test_a_step_beyond_64_bits_is_a_bad_record_said_once(tmp_path: Path) -> None:
    root = tmp_path / "pt"
    write(root / f"ckpt_{10**30}.pt", 10)
    write(root / "ckpt_5.pt", 10)
    tail = tail_at(root)
    got = tail.read()
    assert [r.step for r in got.rows if ck.STEP_TAG in r.tags] == [5]
    assert len(got.errors) == 1 and "outside the 64-bit range" in got.errors[0]
    assert tail.skipped_records == 1
    again = tail.read()
    assert again.errors == [] and tail.skipped_records == 1


def test_a_huge_folder_is_counted_to_the_cap_and_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ck, "MAX_FILES", 50)
    root = tmp_path / "dcp"
    folder = root / "step_9"
    for i in range(120):
        write(folder / f"__{i}_0.distcp", 2)
    write(folder / ".metadata", 1)
    age(root)
    tail = tail_at(root)
    got = tail.read()
    [row] = [r for r in got.rows if ck.STEP_TAG in r.tags]
    assert row.values[2] == 50 and row.values[1] == 100
    assert len(got.notes) == 1 and "more than 50 files" in got.notes[0]
    assert got.errors == [] and tail.skipped_records == 0
    for i in range(60):  # another as large: the bound was said for the root
        write(root / "step_10" / f"__{i}_0.distcp", 2)
    write(root / "step_10" / ".metadata", 1)
    age(root)
    again = tail.read()
    assert [r.step for r in again.rows if ck.STEP_TAG in r.tags] == [10] and again.notes == []


def test_a_root_of_many_entries_is_read_in_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ck, "MAX_ENTRIES", 20)
    root = tmp_path / "pt"
    for i in range(30):
        write(root / f"ckpt_{i}.pt", 1)
    got = tail_at(root).read()
    assert len([r for r in got.rows if ck.STEP_TAG in r.tags]) == 20
    assert len(got.notes) == 1


def test_a_read_looks_at_so_many_files_and_leaves_the_rest_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ck, "SCAN_FILES", 5)
    root = tmp_path / "out"
    for step in (10, 20, 30):
        hf(root, step)
    tail = tail_at(root)
    seen: list[int] = []
    for _ in range(5):
        got = tail.read()
        seen += [r.step for r in got.rows if ck.STEP_TAG in r.tags]
        if not got.more:
            break
    assert seen == [10, 20, 30]


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "out"
    folder = hf(root, 10)
    os.symlink("..", folder / "loop")  # a loop
    os.symlink("/", folder / "outside")  # out of the root
    os.symlink(".", root / "latest")
    os.symlink(str(tmp_path / "elsewhere"), root / "checkpoint-20")
    write(tmp_path / "elsewhere/model.safetensors", 10**6)
    age(folder)
    got = tail_at(root).read()
    assert [(r.step, r.values[1]) for r in got.rows if ck.STEP_TAG in r.tags] == [(10, 3010.0)]


# -- restarts and rotation ----------------------------------------------------------------


def test_a_restarted_tail_tells_nothing_twice_and_relearns_what_the_state_lacks(
    tmp_path: Path,
) -> None:
    root = tmp_path / "out"
    hf(root, 10)
    hf(root, 20)
    first = tail_at(root)
    assert [r.step for r in first.read().rows if ck.STEP_TAG in r.tags] == [10, 20]
    saved = first.checkpoint()
    assert saved.offset == 2
    hf(root, 30)
    log = Root.watched(tmp_path).checkpoints(root)
    resumed = follow(log, saved)
    got = resumed.read()
    assert [r.step for r in got.rows if ck.STEP_TAG in r.tags] == [30]
    empty = Checkpoint(str(root), 0, 0, b"", 0)
    relearning = follow(log, saved, relearn_from=empty)
    assert relearning.relearning
    got = relearning.read()
    assert [r.step for r in got.replayed_rows if ck.STEP_TAG in r.tags] == [10, 20]
    assert [r.step for r in got.rows if ck.STEP_TAG in r.tags] == [30]
    assert not relearning.relearning


def test_the_newest_complete_checkpoint_is_the_last_good_one_across_a_restart(
    tmp_path: Path,
) -> None:
    """What `status` shows: the newest complete checkpoint, not a partial one after it."""
    root = tmp_path / "out"
    hf(root, 10)
    hf(root, 20)
    hf(root, 30, state=False)  # a save that died before its last file, long ago
    first = tail_at(root)
    assert first.newest() is None
    first.read()
    step, wall, path = first.newest() or (0, 0.0, "")
    assert (step, path) == (20, str(root / "checkpoint-20"))
    assert wall == pytest.approx(HOUR_AGO)
    resumed = follow(Root.watched(tmp_path).checkpoints(root), first.checkpoint())
    assert isinstance(resumed, ck.CheckpointTail) and resumed.newest() == first.newest()


def test_rotated_checkpoints_are_forgotten_and_new_ones_told(tmp_path: Path) -> None:
    root = tmp_path / "out"
    old = hf(root, 10)
    tail = tail_at(root)
    assert [r.step for r in tail.read().rows if ck.STEP_TAG in r.tags] == [10]
    for path in sorted(old.rglob("*"), reverse=True):
        path.unlink()
    old.rmdir()  # save_total_limit rotated it away
    hf(root, 20)
    assert [r.step for r in tail.read().rows if ck.STEP_TAG in r.tags] == [20]
    assert set(tail.checkpoint().decoder_state["told"]) == {"checkpoint-20"}
    for path in sorted(root.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    root.rmdir()
    assert tail.read().gone


# -- discovery ---------------------------------------------------------------------------


def test_discovery_finds_one_log_per_root_and_does_not_walk_its_checkpoints(
    tmp_path: Path,
) -> None:
    top = tmp_path / "logs"
    for step in (10, 20):
        hf(top / "out", step)
    write(top / "out/runs/Jan01/events.out.tfevents.1.host", 0)
    write(top / "out/checkpoint-20/events.out.tfevents.9.host", 0)  # inside: not walked
    version = "lightning_logs/version_0"
    lt = top / version
    write(lt / "events.out.tfevents.2.host", 0)
    write(lt / "checkpoints/epoch=0-step=5.ckpt", 5)
    write(lt / "checkpoints/epoch=0-step=9.ckpt", 5)
    root = Root.watched(top)
    found = {(str(f.path.relative_to(top)), f.kind, f.run) for f in root.scan()}
    assert found == {
        ("out", "checkpoints", "out"),
        ("out/runs/Jan01/events.out.tfevents.1.host", "tfevents", "out/runs/Jan01"),
        ("lightning_logs/version_0/checkpoints", "checkpoints", "lightning_logs/version_0"),
        (
            "lightning_logs/version_0/events.out.tfevents.2.host",
            "tfevents",
            "lightning_logs/version_0",
        ),
    }
    # a file inside a checkpoint, as the watcher names it, is its root's
    described = root.describe(top / "out/checkpoint-10/optimizer.pt")
    assert described is not None and described.path == top / "out"
    known = {str(top / "out"), str(lt / "checkpoints")}
    assert [f for f in root.walk(known=known)[0] if f.kind == "checkpoints"] == []


def test_the_loop_reads_a_settling_checkpoint_again_without_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.in_process import following

    monkeypatch.setattr(ck, "SETTLE_SECONDS", 0.3)
    root = tmp_path / "logs"
    root.mkdir()
    with following(root, tmp_path / "state") as (daemon, got):
        write(root / "job/checkpoints/epoch=0-step=4.ckpt", 10, at=None)
        for _ in range(100):
            if any(p.tag == ck.STEP_TAG for p in got):
                break
            daemon.cycle(timeout=0.1)
        assert [(p.run, p.step) for p in got if p.tag == ck.STEP_TAG] == [("job", 4)]
        assert daemon.sweep_interval() > 1  # told by its own look again, not a sweep


def test_a_folder_with_its_framework_last_file_is_told_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(ck, "time", SimpleNamespace(time=clock.time, monotonic=clock.monotonic))
    root = tmp_path / "out"
    folder = hf(root, 10)
    age(folder, at=clock.now)
    tail = tail_at(root)
    assert tail.read().again_in == pytest.approx(ck.MARKED_SETTLE_SECONDS)
    clock.now += ck.MARKED_SETTLE_SECONDS
    assert [r.step for r in tail.read().rows if ck.STEP_TAG in r.tags] == [10]


def test_a_checkpoint_moved_into_a_followed_root_wakes_it(tmp_path: Path) -> None:
    from support.in_process import following

    root = tmp_path / "logs"
    hf(root / "out", 10)
    staged = hf(tmp_path / "staging", 20)  # written elsewhere, renamed into place (Orbax)
    with following(root, tmp_path / "state") as (daemon, got):
        daemon.cycle(timeout=0.1)
        assert [p.step for p in got if p.tag == ck.STEP_TAG] == [10]
        staged.rename(root / "out/checkpoint-20")
        for _ in range(50):
            if len([p for p in got if p.tag == ck.STEP_TAG]) == 2:
                break
            daemon.cycle(timeout=0.1)
        assert [p.step for p in got if p.tag == ck.STEP_TAG] == [10, 20]


@pytest.fixture
def configured() -> Iterator[None]:
    use_names(["weights-{step}.bin", "snapshot_*_{step}"])
    yield
    use_names([])


def test_names_the_config_gives_are_checkpoints_of_their_step(
    tmp_path: Path, configured: None
) -> None:
    """`checkpoint_names`: a file and a folder no framework names so, complete once settled;
    a name the framework gives still judged as the framework's."""
    root = tmp_path / "out"
    write(root / "weights-100.bin", 500)
    write(root / "snapshot_llama_200" / "shard-0.data", 300)
    write(root / "weights-final.bin", 50)  # no step: no checkpoint
    age(root / "snapshot_llama_200")
    hf(root, 300, state=False)  # the Trainer's folder waits for its last file
    assert root_of(root / "snapshot_llama_200" / "shard-0.data", tmp_path) == root
    got = tail_at(root).read()
    assert [(r.step, r.values[1]) for r in got.rows if ck.STEP_TAG in r.tags] == [
        (100, 500.0), (200, 300.0),
    ]  # fmt: skip
    assert folder_by_name("snapshot_{step}") is None and checkpoint_file("weights-.bin") is None


def test_without_the_config_those_names_are_no_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "out"
    write(root / "weights-100.bin", 500)
    hf(root, 10)
    assert steps_of(told(root)) == [10]
