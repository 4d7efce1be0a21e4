"""A stand-in worker for tests/test_forkserver.py: ``python -m tests.forked_probe RUN_DIR``, run
cold or forked warm by the fork server. It writes what it sees of its own process to
RUN_DIR/report.json, then does what RUN_DIR/ask.json asks (all optional):
``{"threads": N, "grandchild": true, "sleep": SECONDS, "exit": CODE, "raise": true}``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch


def _fds() -> dict[str, str]:
    links = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            links[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the directory's own descriptor, closed by now
            pass
    return links


def main() -> int:
    run_dir = Path(sys.argv[1])
    ask_file = run_dir / "ask.json"
    ask = json.loads(ask_file.read_text()) if ask_file.exists() else {}
    torch.set_num_threads(ask.get("threads", 1))
    product = torch.ones(256, 256) @ torch.ones(256, 256)  # runs on the intra-op pool
    grandchild = subprocess.Popen(["sleep", "300"]) if ask.get("grandchild") else None
    main_module = sys.modules["__main__"]
    report = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "pgid": os.getpgrp(),
        "sid": os.getsid(0),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "path0": sys.path[0],
        "main": main_module.__spec__.name if main_module.__spec__ else None,
        "torch_threads": torch.get_num_threads(),
        "product": float(product[0, 0]),
        "numpy_draw": float(np.random.random()),
        "fds": _fds(),
        "echo": subprocess.run(["echo", "from a grandchild"], capture_output=True, text=True, check=True).stdout,
        "grandchild": grandchild.pid if grandchild else None,
    }
    print("probe stdout")
    print("probe stderr", file=sys.stderr)
    tmp = run_dir / "report.json.tmp"
    tmp.write_text(json.dumps(report))
    tmp.rename(run_dir / "report.json")
    time.sleep(ask.get("sleep", 0))
    if ask.get("raise"):
        raise RuntimeError("the probe was asked to fail")
    return int(ask.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
