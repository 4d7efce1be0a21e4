"""Kill points for crash tests: a process dies by SIGKILL at a named point of its work.

``EVOTUI_KILL_AT=NAME[:N][,NAME[:N]...]`` kills the process the N-th time (default: the first) it
reaches ``point(NAME)``; with ``EVOTUI_KILL_ONCE=DIR`` each point fires once across processes (a
file DIR/NAME is made before the kill, so a relaunched process goes on). Unset, `point` costs one
lookup.

``EVOTUI_MEET=NAME:N:DIR`` is a rendezvous for tests that assert that runs overlap: the first time a
process reaches ``point(NAME)`` it makes a file DIR/<pid> and waits until N processes have (at most
`MEET_SECONDS`, then it goes on alone), so that work on either side of the point overlaps whenever
the processes really run at the same time, however long their imports took.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

#: The longest a process waits at a rendezvous for the others (runs that never overlap: the test fails).
MEET_SECONDS = 60.0

_reached: Counter[str] = Counter()
_met: set[str] = set()


def point(name: str) -> None:
    _meet(name)
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


def _meet(name: str) -> None:
    spec = os.environ.get("EVOTUI_MEET")
    if not spec or name in _met:
        return
    wanted, _, rest = spec.partition(":")
    count, _, folder = rest.partition(":")
    if wanted != name:
        return
    _met.add(name)
    here = Path(folder)
    here.mkdir(parents=True, exist_ok=True)
    (here / str(os.getpid())).touch()
    deadline = time.monotonic() + MEET_SECONDS
    while len(list(here.iterdir())) < int(count) and time.monotonic() < deadline:
        time.sleep(0.05)
