"""The benchmark's jobs side by side.

A seed is one *prepare* job (its clone with v0 built and evaluated on test, the base arm, a copy
of the clone for each training arm: `arms.prepare_seed`) and then one job per training arm
(`arms.run_trained_arm`). With `lanes` > 1 each job is a process of its own
(``python -m engine.bench.lanes JOB_FILE``), at most `lanes` of them at once, and every run it
starts gets `cores // lanes` torch threads (``OMP_NUM_THREADS``, which a worker reads when it
imports torch), the prepare job of a one-seed benchmark too: a seed's results depend on the lane
count, not on how many seeds run beside it. (The thread count is part of a run's inputs: the
embedded policy's warm-up, seeded, ends with the same weights bit for bit on one thread every
time, and with others on two; the code sample's seed 7 built a v0 scoring 0.606 on test alone on
two threads, 0.479 on one.)
A tiny policy's step keeps two threads only partly busy: on 2 cores an arm on one thread beside
another takes 1.4 to 1.7 times as long as alone on both, so two lanes do the same work in about
0.8 of the time (the math report: 54.9 minutes against 68.6, docs/bench.md).
The arms share nothing a lane could race on: each has its own copy of the seed's clone, its own
store and its own engine.

Every seed's prepare job is queued at the start and each seed's arms as soon as its prepare ends,
so a lane waits only when nothing is ready. A job writes its result (an `ArmResult`) as JSON for
this process to read; its output goes to ``seed<k>/lanes/<arm>.log`` and, line by line, to `say`,
tagged with its seed and arm. A job that fails stops the others (SIGTERM, which a job takes as
Ctrl-C: its engine stops its workers, whose runs stay resumable) and the benchmark raises
`BenchError` naming its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from engine.bench.arms import (
    ARMS,
    TRAINED,
    ArmResult,
    BenchError,
    BenchSettings,
    Say,
    prepare_seed,
    run_trained_arm,
)

#: One lane per training arm at most: a seed has no more jobs to run at once.
MAX_LANES = len(TRAINED)


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, or fewer where OMP_NUM_THREADS already
    limits it (a test worker, a scheduler's slot): the lanes share what was given, not the machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    given = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(given))) if given.isdigit() and int(given) > 0 else cores


def default_lanes(cores: int | None = None) -> int:
    """One lane per core, at most `MAX_LANES`."""
    return max(1, min(MAX_LANES, cores or available_cores()))


def threads_per_lane(lanes: int, cores: int | None = None) -> int:
    """The torch threads of each run: the cores shared out between the lanes, one at least."""
    return max(1, (cores or available_cores()) // lanes)


@dataclass(frozen=True)
class Job:
    """A seed's prepare job (`arm` "base": it returns the base arm) or one of its training arms."""

    seed: int
    arm: str

    def files(self, root: Path) -> tuple[Path, Path, Path]:
        """(the job's description, its result, its output) under the seed's directory."""
        where = root / f"seed{self.seed}" / "lanes"
        return where / f"{self.arm}.job.json", where / f"{self.arm}.result.json", where / f"{self.arm}.log"


def run_in_lanes(
    source: Path,
    root: Path,
    settings: BenchSettings,
    skills: list[Path],
    lanes: int,
    say: Say,
    python: str = sys.executable,
) -> list[ArmResult]:
    """Every seed's jobs, at most `lanes` at once; the results in seed order, then `ARMS` order."""
    return _Lanes(source, root, settings, skills, lanes, say, python).run()


class _Lanes:
    def __init__(
        self, source: Path, root: Path, settings: BenchSettings, skills: list[Path], lanes: int, say: Say, python: str
    ):
        self.source, self.root, self.settings, self.skills = source, root, settings, skills
        self.lanes, self.python = lanes, python
        self.threads = threads_per_lane(lanes)
        self._say, self._said = say, threading.Lock()
        self.live: dict[Job, subprocess.Popen[str]] = {}
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def say(self, line: str) -> None:
        with self._said:
            self._say(line)

    def run(self) -> list[ArmResult]:
        results: dict[Job, ArmResult] = {}
        with ThreadPoolExecutor(self.lanes, thread_name_prefix="bench-lane") as pool:
            pending: dict[Future[ArmResult], Job] = {}

            def submit(job: Job) -> None:
                pending[pool.submit(self._run, job)] = job

            for seed in self.settings.seeds:
                submit(Job(seed, "base"))
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        job = pending.pop(future)
                        results[job] = future.result()
                        if job.arm == "base":
                            for arm in TRAINED:
                                submit(Job(job.seed, arm))
            except BaseException as exc:
                with self._lock:
                    self.stopping.set()
                for future in pending:
                    future.cancel()
                # Ctrl-C from a terminal reached the jobs already (one process group): they get a
                # moment to stop on their own before they are told to.
                self._stop_all(grace=10.0 if isinstance(exc, KeyboardInterrupt) else 0.0)
                raise
        return [results[Job(seed, arm)] for seed in self.settings.seeds for arm in ARMS]

    def _run(self, job: Job) -> ArmResult:
        spec_path, out, log = job.files(self.root)
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec = {
            "source": str(self.source),
            "root": str(self.root / f"seed{job.seed}"),
            "seed": job.seed,
            "arm": job.arm,
            "settings": self.settings.to_dict(),
            "skills": [str(p) for p in self.skills],
            "out": str(out),
        }
        spec_path.write_text(json.dumps(spec, indent=2), encoding="utf-8")
        own = f"seed {job.seed}:"
        # Every job on the lanes' threads, a lone seed's prepare job too (which would have the
        # machine to itself): torch's results differ in their last bits on another thread count,
        # so a v0 built on two threads is not the v0 the same seed builds beside others on one.
        threads = str(self.threads)
        with log.open("w", encoding="utf-8") as sink:
            proc = subprocess.Popen(
                [self.python, "-m", "engine.bench.lanes", str(spec_path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=os.environ | {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONUNBUFFERED": "1"},
                text=True,
                encoding="utf-8",
                errors="replace",
            )
            with self._lock:
                self.live[job] = proc
                if self.stopping.is_set():  # the benchmark failed while this one was starting
                    proc.send_signal(signal.SIGTERM)
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                sink.flush()
                text = line.rstrip("\n")
                self.say(text if text.startswith(own) else f"seed {job.seed} {job.arm} | {text}")
            code = proc.wait()
        if code != 0 or not out.exists():
            what = "the prepare job (v0, the base arm)" if job.arm == "base" else f"arm {job.arm}"
            raise BenchError(f"seed {job.seed}, {what}: its process ended with exit code {code}; its output: {log}")
        return ArmResult.from_dict(json.loads(out.read_text(encoding="utf-8")))

    def _stop_all(self, grace: float) -> None:
        with self._lock:
            procs = list(self.live.values())
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """A job's process: the job its file describes; its result written where the file says."""
    argv = sys.argv[1:] if argv is None else argv
    # Stopped by the benchmark (SIGTERM) or by Ctrl-C, even where a shell started it with SIGINT
    # ignored (in the background): the engine's interruption stops the run workers it started,
    # which would otherwise go on training.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    settings = BenchSettings.from_dict(job["settings"])
    root = Path(job["root"])

    def say(line: str) -> None:
        print(line, flush=True)

    if job["arm"] == "base":
        skills = [Path(p) for p in job["skills"]]
        result = prepare_seed(Path(job["source"]), root, job["seed"], settings, say, skills)
    else:
        result = run_trained_arm(job["arm"], root, job["seed"], settings, say)
    Path(job["out"]).write_text(json.dumps(result.to_dict()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
