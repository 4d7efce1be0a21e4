"""The benchmark's lanes: jobs side by side, each a process of its own, and what happens when one
fails. The jobs here are played by a stand-in interpreter (a shell script that reads the job file
it is given), so the scheduling is tested without training anything; `tests/test_bench.py` runs
the real jobs in one process and CI's quick benchmark (`benchmarks/autonomy.py --quick --check`)
in lanes, checking each run's threads."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from engine.bench.arms import ARMS, BenchError, BenchSettings
from engine.bench.lanes import MAX_LANES, available_cores, default_lanes, run_in_lanes, threads_per_lane

SETTINGS = BenchSettings(budget_steps=2, version_steps=1, seeds=(1, 2))


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable taking the place of the Python interpreter: called as `python -m MODULE JOB`,
    it sees the job file as $3 and the job's threads in OMP_NUM_THREADS."""
    path = tmp_path / "python"
    path.write_text('#!/bin/sh\njob="$3"\n' + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_lanes_are_one_per_core_up_to_the_training_arms_and_share_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [default_lanes(c) for c in (1, 2, 3, 16)] == [1, 2, 3, MAX_LANES]
    # A process already limited to one thread (a test worker, a scheduler's slot) shares that.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert available_cores() == 1 and default_lanes() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert available_cores() == len(os.sched_getaffinity(0))
    assert MAX_LANES == len(ARMS) - 1
    assert [threads_per_lane(n, cores=2) for n in (1, 2, 4)] == [2, 1, 1]
    assert threads_per_lane(4, cores=16) == 4


def test_a_failing_job_stops_the_others_and_names_its_output(tmp_path: Path) -> None:
    # Seed 1's prepare job runs until it is stopped; seed 2's fails after a word on its output.
    python = stand_in(
        tmp_path,
        'if grep -q \'"seed": 1,\' "$job"; then exec sleep 120; fi\necho "no workspace here"\nexit 3\n',
    )
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(BenchError) as caught:
        run_in_lanes(tmp_path / "ws", tmp_path / "bench", SETTINGS, [], 2, lines.append, python=python)
    log = tmp_path / "bench" / "seed2" / "lanes" / "base.log"
    assert "seed 2, the prepare job" in str(caught.value) and "exit code 3" in str(caught.value)
    assert str(log) in str(caught.value) and log.read_text() == "no workspace here\n"
    assert "seed 2 base | no workspace here" in lines
    # Seed 1's job was told to stop: the benchmark did not wait the two minutes of its sleep.
    assert time.monotonic() - started < 60
    # No seed's arms were started: each waits for its seed's prepare job.
    assert not list((tmp_path / "bench").glob("seed*/lanes/full.job.json"))


#: The arm result a stand-in job answers with (naming its arm and seed).
ANSWER = {
    "arm": "?",
    "seed": 0,
    "workspace": "",
    "final": "v0",
    "clean_greedy": None,
    "clean_sampled": None,
    "clean_halfwidth": None,
    "seen_greedy": None,
    "steps": 0,
    "cpu_seconds": 0.0,
    "wall_seconds": 0.0,
    "versions": [],
}


def answering(result: dict[str, object]) -> str:
    """A stand-in job's body: it writes its threads to its output and answers with `result`,
    named after its job's arm and seed."""
    return (
        f'echo "threads $OMP_NUM_THREADS"\n'
        f'python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=json.loads(sys.argv[2]);'
        f" r.update(arm=j['arm'], seed=j['seed']);"
        f" open(j['out'], 'w').write(json.dumps(r))\" \"$job\" '{json.dumps(result)}'\n"
    )


def test_each_seeds_arms_follow_its_prepare_job_and_results_come_in_order(tmp_path: Path) -> None:
    body = answering(ANSWER)
    lines: list[str] = []
    results = run_in_lanes(
        tmp_path / "ws", tmp_path / "bench", SETTINGS, [], 2, lines.append, python=stand_in(tmp_path, body)
    )
    assert [(r.seed, r.arm) for r in results] == [(s, a) for s in SETTINGS.seeds for a in ARMS]
    for seed in SETTINGS.seeds:
        logs = tmp_path / "bench" / f"seed{seed}" / "lanes"
        spec = json.loads((logs / "full.job.json").read_text())
        assert spec["root"] == str(tmp_path / "bench" / f"seed{seed}") and spec["settings"]["seeds"] == [1, 2]
        # A prepare job ends before its seed's arms are written out for a lane.
        assert (logs / "base.result.json").stat().st_mtime <= (logs / "hand.job.json").stat().st_mtime
        for arm in ARMS:
            assert (logs / f"{arm}.log").read_text() == f"threads {threads_per_lane(2)}\n"


def test_a_lone_seeds_prepare_job_runs_on_the_lanes_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one seed the prepare job has the machine to itself, yet it runs on the threads its
    seed's prepare job has beside others (a v0 built on two threads is another v0)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # two cores given, two lanes: one thread each
    assert threads_per_lane(2) == 1 < threads_per_lane(1)
    settings = BenchSettings(budget_steps=2, version_steps=1, seeds=(7,))
    body = answering(ANSWER)
    run_in_lanes(tmp_path / "ws", tmp_path / "bench", settings, [], 2, lambda _: None, python=stand_in(tmp_path, body))
    logs = tmp_path / "bench" / "seed7" / "lanes"
    assert {arm: (logs / f"{arm}.log").read_text() for arm in ARMS} == {arm: "threads 1\n" for arm in ARMS}
