"""Which child continues its parent's training, and the point it resumes from.

A child whose workspace config is its parent's, except perhaps `recipe.steps` (the coach's
no-change control, an exploit round's continuation) and `recipe.learning_rate`, trains on from
where its parent's run ended: the weights, AdamW's moments, the scheduler, the RNG states, TRL's
global step (and with it the position in the train data), the group filter's and the collapse
guard's state. A lineage trained in segments is then the same training as one long run, and a
segment's gain is what more training buys, not what a fresh optimizer and the first prompts again
buy. A new learning rate is one long run whose rate changes at the segment's first step: AdamW's
moments are running averages of the gradients, whatever rate they were taken at, and the
schedule is constant, so the worker sets the new rate after the parent's optimizer and scheduler
are restored (`worker._Rate`). Any other change starts afresh from the parent's weights: the
recipe it would resume was made for other settings (the filter's threshold for another reward,
the data position for another train set, the moments for another loss or group).

Each train run keeps its final checkpoint (TRL's own, with `engine.runs.checkpoint_state`'s file)
in its version's model directory, `RESUME_DIR`; the run's own checkpoints go with its run
directory. A continuation reads it in place and records its own steps from 1, like any run: only
TRL's internal global step counts from the lineage's start.

This module is read by the engine, so it imports neither torch nor transformers.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from engine.config import WorkspaceConfig

#: The folder of a version's model directory that holds its run's final checkpoint (``checkpoint-STEP``).
RESUME_DIR = "resume"
#: The recipe's settings a continuation may change: how long it trains, and at which rate.
RESUMABLE = ("steps", "learning_rate")
#: transformers' `TRAINER_STATE_NAME`: written last, it makes a checkpoint whole.
TRAINER_STATE = "trainer_state.json"


def continues_training(parent: WorkspaceConfig, child: WorkspaceConfig) -> bool:
    """Whether `child` continues `parent`'s training: every setting the same but `recipe.steps`
    (how many more steps it trains) and `recipe.learning_rate` (the rate it trains them at)."""
    a, b = parent.model_dump(mode="json"), child.model_dump(mode="json")
    for recipe in (a["recipe"], b["recipe"]):
        for key in RESUMABLE:
            recipe.pop(key)
    return a == b


def checkpoint_step(checkpoint: Path) -> int:
    """TRL's global step of a checkpoint folder ``checkpoint-STEP``."""
    return int(checkpoint.name.rpartition("-")[2])


def last_checkpoint(folder: Path) -> Path | None:
    """The latest whole checkpoint under `folder`: transformers writes `trainer_state.json` last,
    so a checkpoint without one was cut off mid-save (skipped)."""
    whole = {
        int(m[1]): d
        for d in folder.glob("checkpoint-*")
        if (m := re.fullmatch(r"checkpoint-(\d+)", d.name)) and (d / TRAINER_STATE).is_file()
    }
    return whole[max(whole)] if whole else None


def kept_checkpoint(model_dir: Path) -> Path | None:
    """The final checkpoint a version's train run kept (None: v0, a run the collapse guard stopped,
    or one from before runs kept theirs)."""
    return last_checkpoint(model_dir / RESUME_DIR)


def keep(checkpoint: Path, model_dir: Path) -> Path:
    """Keep `checkpoint` as the resume point of the version `model_dir` holds, in place of any
    earlier one. Its files are hard links where the filesystem allows (the run directory's copy
    is deleted when the run ends), else copies; the folder appears whole or not at all."""
    tmp = model_dir / f".{RESUME_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copytree(checkpoint, tmp / checkpoint.name, copy_function=_link_or_copy)
    final = model_dir / RESUME_DIR
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final / checkpoint.name


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)
