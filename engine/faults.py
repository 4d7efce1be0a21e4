"""Kill points for crash tests: a process dies by SIGKILL at a named point of its work.

``EVOTUI_KILL_AT=NAME[:N][,NAME[:N]...]`` kills the process the N-th time (default: the first) it
reaches ``point(NAME)``; with ``EVOTUI_KILL_ONCE=DIR`` each point fires once across processes (a
file DIR/NAME is made before the kill, so a relaunched process goes on). Unset, `point` costs one
lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

_reached: Counter[str] = Counter()


def point(name: str) -> None:
    spec = os.environ.get("EVOTUI_KILL_AT")
    if not spec:
        return
    wanted = dict(item.partition(":")[::2] for item in spec.split(","))
    if name not in wanted:
        return
    _reached[name] += 1
    if _reached[name] != int(wanted[name] or 1):
        return
    once = os.environ.get("EVOTUI_KILL_ONCE")
    if once:
        try:
            (Path(once) / name).touch(exist_ok=False)
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)
