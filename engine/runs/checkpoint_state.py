"""What a run's checkpoint keeps besides TRL's own state: the collapse guard's and the group filter's.

Both live in the worker's memory and change every step. A worker resumed from a checkpoint must
go on with what they were at that checkpoint's step: not empty (a collapse under way would evade
the guard, a run the guard stopped would train on), and not what they became in the steps after
it, which the resumed worker replays.

They are saved into the checkpoint rather than rebuilt from the run's stored steps on resume:
- The file is written into the checkpoint folder before transformers writes `trainer_state.json`,
  the file that makes a checkpoint whole (`continuation.last_checkpoint`). A whole checkpoint therefore
  always carries the state of its own step, and a checkpoint cut off mid-save is skipped together
  with it: no second notion of "the last good step" to keep in agreement with TRL's.
- A rebuild would read rollout files that run past the checkpoint (the killed worker wrote the
  steps about to be replayed) and would have to recompute the guard's and the filter's inputs
  exactly as the live run did, tying the resume to the Parquet layout; on several GPUs rank 0
  stores only its share of a batch, while each rank's filter and guard saw their own.
- A stop is itself state: it is kept with the weights of the step the guard stopped at, so a
  resumed stopped run ends at once with the same reason instead of replaying its way there.

A continuation (`engine.runs.continuation`) resumes from its parent's final checkpoint, file and
all: the guard's windows and the filter's threshold go on across a lineage's segments as they do
across one run's steps.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from engine.runs.group_filter import GroupFilter
from engine.runs.guard import CollapseGuard

#: The file in a checkpoint folder (``checkpoint-STEP``); one per process on several, as
#: transformers names its RNG states (``rng_state_N.pth``).
STATE_FILE = "evotui_state.json"


def state_file(checkpoint: Path, process_index: int = 0, world_size: int = 1) -> Path:
    return checkpoint / (STATE_FILE if world_size <= 1 else f"evotui_state_{process_index}.json")


def save(file: Path, step: int, guard: CollapseGuard, group_filter: GroupFilter | None) -> None:
    """The guard's and the filter's state after `step` steps, written atomically into `file`."""
    state: dict[str, Any] = {
        "step": step,
        "guard": guard.state(),
        "group_filter": group_filter.state() if group_filter is not None else None,
    }
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(state), encoding="utf-8")
    os.replace(tmp, file)


def restore(file: Path, step: int, guard: CollapseGuard, group_filter: GroupFilter | None) -> bool:
    """Put the guard and the filter back to what `file` saved at `step`; False when the checkpoint
    has no such file (written by a worker from before this file existed: they start empty, as
    they did then)."""
    if not file.is_file():
        return False
    state = json.loads(file.read_text(encoding="utf-8"))
    if state["step"] != step:
        raise ValueError(
            f"{file}: saved at step {state['step']} but its checkpoint is step {step};"
            " delete the checkpoint folder to resume from an earlier one"
        )
    guard.restore(state["guard"])
    if group_filter is not None and state["group_filter"] is not None:
        group_filter.restore(state["group_filter"])
    return True
