"""Which files and folders are training checkpoints, by the names frameworks give them.

A checkpoint is one entry of a *checkpoint root*, the directory a job saves
into: a file (Lightning's `epoch=0-step=100.ckpt`, torch's `ckpt_1000.pt`) or a
folder (HF's `checkpoint-500/`, DeepSpeed's `global_step100/`, Megatron's
`iter_0000100/`, a torch.distributed.checkpoint folder, an Orbax step folder).
The step it holds is read from its name. This module only names things, from
paths and listings, so discovery (discover.py), the watcher's events
(discover.store_of) and the tail that reads a root (checkpoints.py) agree; it
imports neither of them.

What is recognised (the step read from the name), and what marks a folder as
complete (checkpoints.py judges it):

- HF Trainer: `checkpoint-<N>/`, complete once it holds `trainer_state.json`,
  which the Trainer writes last;
- DeepSpeed: `global_step<N>/`, complete once the root's `latest` names step N
  or a later one (or the root has no `latest`);
- Megatron-LM: `iter_<N>/`, likewise with `latest_checkpointed_iteration.txt`;
- torch.distributed.checkpoint: a folder named with a step holding `.metadata`,
  which its coordinator writes after every rank's `*.distcp`;
- Orbax / flax: `<N>/` holding `_CHECKPOINT_METADATA`, and `checkpoint_<N>`
  (a file or a folder);
- Lightning: a `*.ckpt` named with `step=<N>` (ModelCheckpoint's `epoch=E-step=S`);
- torch: a `*.pt` or `*.pth` named with a step (`ckpt_1000.pt`,
  `model_step1000.pth`, `step-1000.pt`);
- any folder named with a step that holds `*.safetensors`, `*.pt`, `*.pth` or
  `*.bin`.

Others are named by the daemon's config (`checkpoint_names`, `use_names`): a
name with `{step}` where its step is and `*` for any characters, matched by a
file or a folder of a root, complete once its files settled.

Files and folders without a marker are complete once their files settled.
Pointers are not checkpoints: Lightning's `last.ckpt` (a copy or link of the
newest), DeepSpeed's `latest`, Megatron's `latest_checkpointed_iteration.txt`.
A folder named as a framework stages one (`tmp-checkpoint-<N>`, Orbax's
`<N>.orbax-checkpoint-tmp-<t>`, any `*.tmp`) is a checkpoint being written, and
left behind a partial one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import re2

# the root a checkpoint container belongs to: `lightning_logs/version_0/checkpoints/` is
# the checkpoints of the run `lightning_logs/version_0` (where its TensorBoard logs are)
CONTAINER_NAMES = frozenset({"checkpoints", "checkpoint", "ckpt", "ckpts", "checkpointing"})

# folders that are a checkpoint by their name alone
_FOLDER = re.compile(r"^(?:checkpoint-|global_step|iter_|checkpoint_)(\d+)$")
# folders a framework stages a checkpoint in before renaming it: a checkpoint being
# written, or left behind half-written
_STAGED = re.compile(
    r"^(?:tmp-(checkpoint-\d+)|(\d+)\.orbax-checkpoint-tmp-\d+|(.+)\.(?:tmp|partial|incomplete))$"
)
# a step in a name: `step=100`, `step_100`, `global_step100`, `iter_0000100`, `ckpt_1000`,
# `checkpoint-500`; a bare number after one of these words, not any number (`run_1`,
# `epoch_3` and `v2` carry none)
_STEP_IN_NAME = re.compile(
    r"(?:^|[^a-z])(?:global_step|steps?|iter|iteration|ckpt|checkpoint)[-_=]?(\d+)(?![0-9])",
    re.IGNORECASE,
)
# files that are a checkpoint of their own, beside their root's other entries
_FILE_SUFFIXES = (".ckpt", ".pt", ".pth")
# what makes a folder named with a step a checkpoint: the files checkpoints are made of;
# a bare number (`5/`) takes the two frameworks' own metadata files only
MARKER_NAMES = frozenset({".metadata", "_CHECKPOINT_METADATA", "trainer_state.json"})
MARKER_SUFFIXES = (".safetensors", ".distcp", ".pt", ".pth", ".bin", ".ckpt")
NUMBERED_MARKERS = frozenset({".metadata", "_CHECKPOINT_METADATA"})
# the files a framework writes last, once every other file of the checkpoint is closed
FRAMEWORK_METADATA = frozenset({".metadata", "_CHECKPOINT_METADATA", "trainer_state.json"})
# names that are pointers to a checkpoint, never one
LIGHTNING_LAST = re.compile(r"^last(?:-v\d+)?\.ckpt$")
DEEPSPEED_POINTER = "latest"
MEGATRON_POINTER = "latest_checkpointed_iteration.txt"
POINTERS = (DEEPSPEED_POINTER, MEGATRON_POINTER)
# files inside a folder that say it is still being written
PARTIAL_SUFFIXES = (".tmp", ".partial", ".incomplete")
# a step is a signed 64-bit integer, as TensorBoard's; more digits are no step
STEP_DIGITS = 19
MAX_STEP = 2**63 - 1
# how far above a file its checkpoint folder may be (Orbax nests `<N>/default/d/...`)
_DEPTH = 4


# configured names: `{step}` once, where the step's digits are, and `*` for any characters
# but a path's `/`, in one entry's name (a name on a filesystem is at most 255 bytes)
STEP_FIELD = "{step}"
MAX_NAME_CHARS = 255
MAX_NAMES = 64  # names configured: a site's few frameworks, not a list of every file
_configured: tuple[Any, ...] = ()  # RE2's compiled regexes (the package has no stubs)


class BadName(ValueError):
    """A configured checkpoint name that cannot say a step (`checkpoint_names`)."""


def name_regex(name: str) -> str:
    """The regex of a configured name, its step's digits its one group (`weights-{step}.bin`
    matches `weights-100.bin` at step 100); BadName says what is wrong with one that could
    not name a checkpoint's step. Matched with RE2, linear in the name however many `*`
    it holds."""
    if not name or len(name) > MAX_NAME_CHARS:
        raise BadName(f"a name of 1 to {MAX_NAME_CHARS} characters, got {len(name)}")
    if name.count(STEP_FIELD) != 1:
        raise BadName(f"{name!r}: say where the step is with `{STEP_FIELD}`, once")
    head, tail = name.split(STEP_FIELD)
    if "/" in name or "{" in head + tail or "}" in head + tail:
        raise BadName(
            f"{name!r}: a file's or folder's own name, with `{STEP_FIELD}` and `*` only"
            " (no `/`, no other `{...}`)"
        )

    def glob(part: str) -> str:
        return "[^/]*".join(re.escape(piece) for piece in part.split("*"))

    return f"{glob(head)}([0-9]+){glob(tail)}"


def use_names(names: Iterable[str]) -> None:
    """Recognise these configured names (`checkpoint_names`) as checkpoints besides the
    frameworks' own, from now on, in every root (name_regex says the form)."""
    global _configured
    _configured = tuple(re2.compile(name_regex(n)) for n in list(names)[:MAX_NAMES])


def configured_step(name: str) -> str | None:
    """The step digits of an entry a configured name matches; None for others."""
    for regex in _configured:
        found = regex.fullmatch(name)
        if found is not None:
            return str(found.group(1))
    return None


class BadStep(ValueError):
    """A name that carries a step no log could hold (`ckpt_1000000000000000000000.pt`)."""


def step_of(digits: str) -> int:
    """The step `digits` say; BadStep beyond the 64-bit range (int() of a huge name would
    cost seconds)."""
    if len(digits.lstrip("0")) > STEP_DIGITS or int(digits) > MAX_STEP:
        shown = digits if len(digits) <= 24 else f"{digits[:24]}..."
        raise BadStep(f"step {shown} outside the 64-bit range")
    return int(digits)


def named_step(name: str) -> str | None:
    """The digits of the step a file's or folder's name carries (the last one named), or
    all of a bare number (Orbax's `<N>/`); None for a name that carries none."""
    ext = os.path.splitext(name)[1]
    stem = name[: -len(ext)] if ext and not ext[1:].isdigit() else name
    if stem.isdigit():
        return stem
    found = None
    for found in _STEP_IN_NAME.finditer(stem):  # noqa: B007 - the last one is the step
        pass
    return found.group(1) if found is not None else None


def framework_folder(name: str) -> bool:
    """A folder a framework names as its checkpoint (HF's, DeepSpeed's, Megatron's, flax's),
    not one a configured name or staging names."""
    return _FOLDER.match(name) is not None


def folder_by_name(name: str) -> str | None:
    """The step digits of a folder that is a checkpoint (or a staged one) by its name alone."""
    found = _FOLDER.match(name)
    if found is not None:
        return found.group(1)
    configured = configured_step(name) if _configured else None
    if configured is not None:
        return configured
    staged = _STAGED.match(name)
    if staged is None:
        return None
    return named_step(next(g for g in staged.groups() if g is not None))


def staged(name: str) -> bool:
    """A folder a framework writes a checkpoint into before renaming it to its own name."""
    return _STAGED.match(name) is not None and folder_by_name(name) is not None


def pointer(name: str) -> bool:
    return name in POINTERS or LIGHTNING_LAST.match(name) is not None


def checkpoint_file(name: str) -> str | None:
    """The step digits of a file that is a checkpoint of its own (a Lightning `.ckpt`, a
    torch `.pt` named with a step, flax's `checkpoint_<N>`); None for other files."""
    if name.endswith(_FILE_SUFFIXES):
        if LIGHTNING_LAST.match(name):
            return None
        digits = named_step(name) if not name[: name.rindex(".")].isdigit() else None
        if digits is not None or not _configured:
            return digits
    found = _FOLDER.match(name)
    if found is not None and name.startswith("checkpoint_"):
        return found.group(1)
    return configured_step(name) if _configured else None


def marker(folder: str, name: str) -> bool:
    """A file that makes the folder holding it, named with a step, a checkpoint."""
    if named_step(folder) is None:
        return False
    if folder.isdigit():
        return name in NUMBERED_MARKERS
    return name in MARKER_NAMES or name.endswith(MARKER_SUFFIXES)


def container(directory: Path) -> bool:
    """A checkpoint root named as what it is (`checkpoints/`): its run is its parent's."""
    return directory.name.lower() in CONTAINER_NAMES


def root_of(path: Path, top: Path) -> Path | None:
    """The checkpoint root of the file at `path`, by names alone (no stat), at or below
    `top`; None for a file that is part of no checkpoint.

    A checkpoint file's root is its directory; a file inside a folder that is a
    checkpoint by its name (or a marker inside a folder named with a step) has the
    folder's parent as its root.
    """
    name = path.name
    parent = path.parent
    if checkpoint_file(name) is not None:
        return parent if _within(parent, top) else None
    if pointer(name):
        return None
    folder = parent
    for _ in range(_DEPTH):
        if folder == top or not _within(folder.parent, top):
            return None
        if folder_by_name(folder.name) is not None:
            return folder.parent
        if folder is parent and marker(folder.name, name):
            return folder.parent
        folder = folder.parent
    return None


def woken_root(path: str) -> str | None:
    """The checkpoint root a changed file may wake (the loop looks it up among its tails):
    its folder's parent when a folder above it within a few levels is named with a step,
    its directory when it is a checkpoint file or a pointer. Names alone, for every file
    event; None for a path that looks like no checkpoint's."""
    head, name = os.path.split(path)
    if checkpoint_file(name) is not None or pointer(name):
        return head
    for _ in range(_DEPTH):
        head, folder = os.path.split(head)
        if not folder:
            return None
        if folder_by_name(folder) is not None or named_step(folder) is not None:
            return head
    return None


def _within(directory: Path, top: Path) -> bool:
    return directory == top or top in directory.parents
