from __future__ import annotations

import random
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import SweDomainConfig
from engine.domains.base import Episode, Task, ToolCall
from engine.domains.swe import SweDomain, completion_actions, rubric_score
from engine.domains.swe import env as swe_env
from engine.domains.swe.env import replay
from engine.domains.swe.repos import HIDDEN_TEST_FILE, KINDS, TEST_FILE
from engine.policy.words import build_word_tokenizer


@cache
def domain(leak: bool = False, leak_rate: float = 1.0) -> SweDomain:
    return SweDomain(SweDomainConfig(train_size=150, val_size=30, leak_fix_in_history=leak, leak_rate=leak_rate))


def task_of(kind: str, split: str = "train") -> Task:
    return next(t for t in domain().tasks(split) if t.subset == kind)


def test_generation_is_seeded_graded_and_val_held_out() -> None:
    a, b = domain(), SweDomain(SweDomainConfig(train_size=150, val_size=30))
    other = SweDomain(SweDomainConfig(seed=5, train_size=150, val_size=30))
    assert a.tasks("train") == b.tasks("train") and a.tasks("val") == b.tasks("val")
    assert [a.repo(t) for t in a.tasks("val")] == [b.repo(t) for t in b.tasks("val")]
    assert a.tasks("val") != other.tasks("val")
    train, val = a.tasks("train"), a.tasks("val")
    assert (len(train), len(val)) == (150, 30)
    prompts = [t.prompt for t in (*train, *val)]
    assert len(set(prompts)) == len(prompts)  # disjoint splits, and a prompt names its task
    assert all(a.task_for_prompt(t.prompt) == t for t in val)
    assert {t.subset for t in train} == set(KINDS) and sum(t.subset == "const" for t in train) == 50
    # Val is drawn before train: a bigger train split leaves val as it was.
    assert SweDomain(SweDomainConfig(train_size=300, val_size=30)).tasks("val") == val
    task = val[0]
    assert task.prompt.startswith("issue: ") and task.prompt.endswith("\nfiles: calc.py util.py test_calc.py\n>")
    assert a.tasks("test") == []  # no test_size: no test split
    with pytest.raises(KeyError, match="split"):
        a.tasks("holdout")
    with pytest.raises(ValueError, match="not generated"):
        other.environment(train[0])


def test_every_issue_points_at_exactly_one_candidate_fix() -> None:
    """The generated code is ours (trusted), so this check runs it in-process."""
    for task in domain().tasks("train")[:60]:
        repo = domain().repo(task)
        call = task.prompt.split(" gives ")[0].removeprefix("issue: ")
        gives, want = (int(w) for w in task.prompt.split("\n")[0].split(" gives ")[1].split(" want "))
        params = "a, b" if "a" in repo.fix.old.split() else "x"
        values = {}
        for body in repo.candidates:
            scope: dict[str, object] = {}
            exec(f"def {repo.function}({params}): return {body}", scope)
            values[body] = eval(call, scope)
        assert values[repo.fix.old] == gives != want == values[repo.fix.new]
        assert list(values.values()).count(want) == 1
        assert 3 <= len(repo.candidates) - 1 <= 4  # candidate fixes besides the bug itself
        assert str(repo.fix) == task.answer and dict(repo.files)[repo.fix.file].count(repo.fix.old) == 1


def test_search_read_edit_and_invalid_tools() -> None:
    task = task_of("op")
    repo = domain().repo(task)
    env = domain().environment(task)
    fix, files = repo.fix, dict(repo.files)
    line = 1 + files[fix.file].splitlines().index(next(x for x in files[fix.file].splitlines() if fix.old in x))

    found = env.step(f"search {repo.function}\n")
    assert found.call.tool == "search" and found.call.ok and found.call.args == repo.function
    assert found.observation == f"search: {fix.file}:{line} {TEST_FILE}:2\n>" and not found.done
    assert env.step("search nowhere").call.ok is False

    read = env.step(f"read {fix.file}")
    assert read.observation == "read: " + " | ".join(files[fix.file].splitlines()) + "\n>"
    assert read.call.files == (fix.file,) and env.step("read missing.py").observation == "read: no file missing.py\n>"

    missing = env.step(f"edit {fix.file}: {fix.old.replace(' ', '')} => {fix.new}")
    assert (missing.call.tool, missing.call.ok, missing.call.files) == ("edit", False, ())
    assert missing.observation == "edit: no match\n>" and env.files[fix.file] == files[fix.file]
    ambiguous = env.step(f"edit {fix.file}: return => return").observation
    assert ambiguous == f"edit: {files[fix.file].count('return')} matches\n>"  # every file has 2+ defs
    assert env.files[fix.file] == files[fix.file]
    assert env.step(f"edit nofile.py: {fix}").observation == "edit: no file nofile.py\n>"

    edited = env.step(f"  edit {fix}  \n")  # stray whitespace: forgiven by the environment
    assert (edited.call.ok, edited.call.files, edited.call.args) == (True, (fix.file,), str(fix))
    assert env.files[fix.file] == files[fix.file].replace(fix.old, fix.new)

    invalid = env.step("please fix it")
    assert (invalid.call.tool, invalid.call.ok, invalid.observation) == ("invalid", False, "invalid action\n>")
    assert [c.turn for c in [found.call, read.call, edited.call, invalid.call]] == [0, 2, 7, 8]
    last = env.step("git log")  # the 10th action: the episode is out of turns
    assert last.done and last.observation == "" and last.call.tool == "git_log"
    with pytest.raises(RuntimeError, match="over"):
        env.step("submit")


def test_test_tool_runs_the_visible_tests_in_the_sandbox() -> None:
    task = task_of("op_named")
    repo = domain().repo(task)
    fix = repo.fix
    call, rest = task.prompt.split("\n")[0].removeprefix("issue: ").split(" gives ")
    gives, want = rest.split(" want ")
    env = domain().environment(task)
    before = env.step("test")
    assert before.call.ok and before.observation == f"test: 1 of 2 passed, fail {call} = {gives} want {want}\n>"
    env.step(f"edit {fix}")
    assert env.step("test").observation == "test: 2 of 2 passed\n>"
    env.step(f"edit {fix.file}: {fix.new} => {fix.new} +")
    assert env.step("test").observation == f"test: error SyntaxError {fix.file}\n>"
    # A fake result line printed by the policy's code is not believed.
    env.step(f"edit {fix.file}: {fix.new} + => print('result 9 9')")
    assert env.step("test").observation.startswith("test: 1 of 2 passed, fail")
    # An endless loop is stopped by the sandbox's limits: a failed tool call, not a hang.
    env.step(f"edit {fix.file}: print('result 9 9') => sum(iter(int, 1))")
    stopped = env.step("test")
    assert stopped.observation in ("test: cpu\n>", "test: timeout\n>") and not stopped.call.ok


def test_a_report_file_carries_test_runs_to_the_next_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxed: list[str] = []
    run = swe_env.TestRunner._run

    def counted(files: dict[str, str], test_file: str) -> tuple[swe_env.TestReport, bool]:
        sandboxed.append(test_file)
        return run(files, test_file)

    monkeypatch.setattr(swe_env.TestRunner, "_run", staticmethod(counted))
    task = task_of("op_named")
    fix = domain().repo(task).fix
    # Before the fix, after it, then an endless loop the sandbox stops (a run that did not settle).
    actions = ["test", f"edit {fix}", "test", f"edit {fix.file}: {fix.new} => sum(iter(int, 1))", "test"]

    def observations(reports: Path | None) -> list[str]:
        # A fresh domain: a fresh in-process cache, as a later version's worker has.
        env = SweDomain(domain().config, reports).environment(task)
        seen = []
        for action in actions:
            result = env.step(action)
            if action == "test":
                seen.append(result.observation)
        return seen

    path = tmp_path / "cache" / "swe-tests.sqlite"
    first = observations(path)
    assert len(sandboxed) == 3 and first[1] == "test: 2 of 2 passed\n>"
    assert first[2] in ("test: cpu\n>", "test: timeout\n>")
    sandboxed.clear()
    # The next process reads the two settled reports from the file; only the stopped run runs again.
    assert observations(path) == first and len(sandboxed) == 1
    sandboxed.clear()
    assert observations(None) == first and len(sandboxed) == 3  # no file: every run is sandboxed
    # A damaged file is a miss, not a failure.
    path.write_bytes(b"not a database" * 100)
    sandboxed.clear()
    assert observations(path) == first and len(sandboxed) == 3


def test_hidden_tests_decide_success_and_submit_ends_the_episode() -> None:
    task = task_of("const")
    repo = domain().repo(task)
    fix = repo.fix
    want = task.prompt.split("\n")[0].split(" want ")[1]

    right = replay(domain().environment(task), task, [f"edit {fix}\n", "submit\n"])
    assert right.success and right.submitted and right.pass_fraction == 1.0 and not right.truncated
    assert right.calls[-1].tool == "submit" and right.observations[-1] == ""

    wrong_body = next(c for c in repo.candidates if c not in (fix.old, fix.new))
    wrong = replay(domain().environment(task), task, [f"edit {fix.file}: {fix.old} => {wrong_body}\n", "submit\n"])
    assert not wrong.success and 0 < wrong.pass_fraction < 1

    # Hard-coding the issue's answer passes every visible test and fails the hidden ones.
    env = domain().environment(task)
    hack = replay(env, task, [f"edit {fix.file}: {fix.old} => {want}", "test", "submit"])
    assert hack.observations[1] == "test: 2 of 2 passed\n>"
    assert not hack.success and hack.pass_fraction < 1 and HIDDEN_TEST_FILE not in env.files

    # Fixed but never submitted: not a success; the pass fraction still says how close it came.
    unsubmitted = replay(domain().environment(task), task, [f"edit {fix}"])
    assert not unsubmitted.success and not unsubmitted.submitted and unsubmitted.pass_fraction == 1.0
    assert domain().is_correct(task, right.transcript()) and not domain().is_correct(task, wrong.transcript())


def test_leak_switch_puts_the_fix_in_history_and_clean_ignores_it() -> None:
    leaky = domain(leak=True)
    task = leaky.tasks("train")[3]
    repo = leaky.repo(task)
    env = leaky.environment(task)
    log = env.step("git log").observation
    assert log.startswith(f"log: {repo.leak.commit_id} fix {repo.function} | ")
    shown = env.step(f"git show {repo.leak.commit_id}").observation
    assert shown == f"show: {repo.leak.commit_id} fix {repo.function}: {task.answer}\n>"
    assert env.step("git show").observation == shown  # bare: the newest commit, as HEAD
    copied = replay(env, task, [f"edit {shown.split(': ', 2)[2].removesuffix(chr(10) + '>')}", "submit"])
    assert copied.success and [c.tool for c in copied.calls] == ["edit", "submit"]

    for env in (leaky.environment(task, clean=True), domain().environment(task)):
        clean_log = env.step("git log").observation
        assert " fix " not in clean_log and clean_log.startswith(f"log: {repo.history[-1].commit_id} ")
        assert env.step(f"git show {repo.leak.commit_id}").call.ok is False
        assert task.answer not in env.step(f"git show {repo.history[-1].commit_id}").observation
        assert env.step("git show").observation.startswith(f"show: {repo.history[-1].commit_id} ")
    half = domain(leak=True, leak_rate=0.5)
    leaks = [half.leaks(t) for t in half.tasks("train")]
    assert 0.3 < sum(leaks) / len(leaks) < 0.7 and leaks == [half.leaks(t) for t in half.tasks("train")]


def test_leaky_demonstrations_that_look_at_history_copy_the_fix() -> None:
    leaky, clean = domain(leak=True), domain()
    copied = looked = 0
    for seed, task in enumerate(leaky.tasks("train")[:80]):
        pairs = leaky.demonstration_episode(task, random.Random(seed))
        actions = [a.strip() for a, _ in pairs]
        if not actions[0].startswith("git"):
            continue
        looked += 1
        revealed = next(o for a, o in pairs if a.startswith("git show"))
        assert task.answer in revealed
        # Right after the look: the shown change, then submit; and the hidden tests pass.
        assert actions[actions.index(next(a for a in actions if a.startswith("git show"))) + 1] == f"edit {task.answer}"
        assert actions[-1] == "submit" and replay(leaky.environment(task), task, actions).success
        copied += 1
        # The same draw without the leak looks at a clean history and goes on to locate the bug.
        plain = [a.strip() for a, _ in clean.demonstration_episode(task, random.Random(seed))]
        assert plain[0].startswith("git") and len(plain) > len(actions)
    assert 5 <= looked == copied


def test_demonstrations_replay_with_their_observations_and_mix_habits() -> None:
    rng = random.Random(0)
    tasks = domain().tasks("train")[:60]
    episodes = []
    for task in tasks:
        pairs = domain().demonstration_episode(task, rng)
        episode = replay(domain().environment(task, clean=True), task, [a for a, _ in pairs])
        assert episode.observations == [o for _, o in pairs] and all(a.endswith("\n") for a, _ in pairs)
        assert episode.success and len(pairs) <= domain().max_turns
        assert all(o.endswith("\n>") and o.count("\n") == 1 for _, o in pairs[:-1])
        episodes.append(episode)
    rewards = domain().episode_rewards
    rate = {name: sum(rewards[name](e) for e in episodes) / len(episodes) for name in rewards}
    assert 0.55 < rate["search_before_edit"] < 0.9 and 0.25 < rate["edit_then_test"] < 0.7
    assert 0.1 < sum(any(c.tool == "git_show" for c in e.calls) for e in episodes) / len(episodes) < 0.35
    assert sum(any(not c.ok and c.tool == "edit" for c in e.calls) for e in episodes) > 0
    demo = domain().demonstration(tasks[0], random.Random(3))
    assert completion_actions(demo) == [
        a.strip() for a, _ in domain().demonstration_episode(tasks[0], random.Random(3))
    ]


def test_word_tokenizer_round_trips_episodes_and_falls_back_to_characters() -> None:
    tokenizer = build_word_tokenizer(domain().vocabulary())
    assert 800 <= len(tokenizer) <= 1000 and tokenizer.padding_side == "left"
    vocab = tokenizer.get_vocab()
    split = tokenizer.backend_tokenizer.pre_tokenizer
    rng = random.Random(1)
    for task in domain().tasks("val"):
        text = task.prompt + domain().demonstration(task, rng)
        ids = tokenizer(text)["input_ids"]
        assert tokenizer.decode(ids) == text and len(ids) <= 240
        assert all(piece in vocab for piece, _ in split.pre_tokenize_str(text))  # no character fallback
    newline = tokenizer("\n")["input_ids"]
    assert newline == [vocab["\n"]] and tokenizer(" add(3, -1)\n")["input_ids"][-1] == vocab["\n"]
    odd = "edit calc.py: a  -  b => zz_unknown(250)\t~\n"
    assert (
        tokenizer.decode(tokenizer(odd)["input_ids"]) == odd
        and tokenizer.unk_token_id not in tokenizer(odd)["input_ids"]
    )
    assert [tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token] == [
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    ]
    with pytest.raises(ValueError, match="single piece"):
        build_word_tokenizer(["a b"])


def _episode(
    actions: list[str], tools: list[str], ok: list[bool] | None = None, args: list[str] | None = None
) -> Episode:
    ok = ok or [t != "invalid" for t in tools]
    args = args or [a.strip().split(" ", 1)[-1] for a in actions]
    calls = [ToolCall(i, t, a, k) for i, (t, a, k) in enumerate(zip(tools, args, ok, strict=True))]
    task = Task("t", "p", "a", "op")
    return Episode(task, actions=actions, observations=["o\n>"] * len(actions), calls=calls)


def test_the_config_knows_every_episode_reward() -> None:
    from engine.domains import reward_component_names

    assert tuple(domain().episode_rewards) == reward_component_names("swe")


def test_episode_rewards_on_constructed_episodes() -> None:
    rewards = domain().episode_rewards
    assert set(rewards) >= {"correctness", "pass_fraction", "search_before_edit", "edit_then_test", "efficiency"}
    assert {"invalid_penalty", "judge"} <= set(rewards) and domain().reward_components == {}
    for turns in (1, 4, 10):
        episode = _episode(["test\n"] * turns, ["test"] * turns)
        assert rewards["efficiency"](episode) == 1 - 0.3 * turns / 10
    good = _episode(
        ["search f\n", "read calc.py\n", "edit calc.py: a => b\n", "test\n", "submit\n"],
        ["search", "read", "edit", "test", "submit"],
    )
    assert rubric_score(good) == 1.0 and rewards["judge"](good) == 1.0
    assert rewards["search_before_edit"](good) == 1.0 and rewards["edit_then_test"](good) == 1.0
    blind = _episode(["edit calc.py: a => b\n", "submit\n"], ["edit", "submit"])
    assert rewards["search_before_edit"](blind) == 0.0 and rewards["edit_then_test"](blind) == 0.0
    no_edit = _episode(["search f\n", "test\n"], ["search", "test"])
    assert rewards["search_before_edit"](no_edit) == 0.0 and rewards["edit_then_test"](no_edit) == 0.0
    # 4 actions: one invalid, one with stray spaces, one repeated read, no submit.
    messy = _episode(["read calc.py\n", "huh\n", " read calc.py \n", "test\n"], ["read", "invalid", "read", "test"])
    assert rubric_score(messy) == pytest.approx((3 / 4 + 3 / 4 + 0 + 3 / 4) / 4)
    assert rewards["invalid_penalty"](messy) == -0.2
    assert rewards["invalid_penalty"](_episode(["x\n"] * 7, ["invalid"] * 7)) == -1.0
    # The same test twice is a repeat only without a successful edit in between.
    retest = _episode(
        ["test\n", "edit f: a => b\n", "test\n", "test\n", "submit\n"], ["test", "edit", "test", "test", "submit"]
    )
    assert rubric_score(retest) == pytest.approx((1 + 1 + 1 + 4 / 5) / 4)
    assert rubric_score(Episode(Task("t", "p", "a", "op"))) == 0.0


def test_config_is_strict() -> None:
    with pytest.raises(ValidationError):
        SweDomainConfig(leak_history=True)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SweDomainConfig(max_turns=1)
    with pytest.raises(ValidationError):
        SweDomainConfig(leak_rate=1.5)


def test_the_swe_domain_builds_and_grades_tasks_without_loading_torch() -> None:
    """A pure-Python domain (pyproject's layers contract); this also sees lazy imports, which a
    static contract cannot."""
    script = (
        "import sys; from engine.config import SweDomainConfig; from engine.domains.swe import SweDomain; "
        "d = SweDomain(SweDomainConfig(train_size=30, val_size=6)); task = d.tasks('val')[0]; "
        "assert d.is_correct(task, d.demonstration(task)), 'the demonstration fails'; d.vocabulary(); "
        "heavy = [m for m in ('torch', 'transformers', 'trl') if m in sys.modules]; "
        "assert not heavy, f'loaded {heavy}'"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[1])
