from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from engine.config import MathDomainConfig
from engine.domains import make_domain, score
from engine.domains.math import MathDomain, closeness, correctness, format_reward, is_well_formed, parse_answer


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    a = make_domain(MathDomainConfig(seed=7, train_size=300, val_size=50))
    b = make_domain(MathDomainConfig(seed=7, train_size=300, val_size=50))
    c = make_domain(MathDomainConfig(seed=8, train_size=300, val_size=50))
    assert a.tasks("train") == b.tasks("train") and a.tasks("val") == b.tasks("val")
    assert a.tasks("val") != c.tasks("val")


def test_val_is_held_out_and_sizes_and_subsets_follow_the_config() -> None:
    domain = make_domain(MathDomainConfig(train_size=500, val_size=100, min_operands=3, max_operands=4))
    train, val = domain.tasks("train"), domain.tasks("val")
    assert (len(train), len(val)) == (500, 100)
    assert not {t.prompt for t in train} & {t.prompt for t in val}
    assert {t.subset for t in train} == {"ops3", "ops4"}
    assert len({t.task_id for t in train}) == 500


def test_demonstrations_are_correct_and_well_formed() -> None:
    domain = MathDomain(MathDomainConfig(train_size=200, val_size=20, max_operand=99, demo_shortcut_rate=0.3))
    rng = random.Random(0)
    demos = [(t, domain.demonstration(t, rng)) for t in domain.tasks("train")]
    assert all(domain.is_correct(t, d) and is_well_formed(d) for t, d in demos)
    shortcuts = sum(d.startswith("A:") for _, d in demos)
    assert 0.15 < shortcuts / len(demos) < 0.45
    chain = domain.demonstration(domain.tasks("train")[0])  # no rng: always the full chain
    assert chain.count("=") == int(domain.tasks("train")[0].subset[3:]) - 1


def test_verifier_and_format_check() -> None:
    domain = MathDomain(MathDomainConfig(train_size=10, val_size=5))
    task = domain.tasks("val")[0]
    right, wrong = f"A:{task.answer}", f"A:{int(task.answer) + 1}"
    assert correctness(task, right) == 1.0 and correctness(task, wrong) == 0.0
    assert parse_answer("3+4=7;A:7") == "7" and parse_answer("3+4=7;A:-12") == "-12"
    assert parse_answer("3+4=7;A:7;junk") is None and parse_answer("") is None
    assert is_well_formed("3+4=7;7-9=-2;A:-2") and is_well_formed("A:5")
    assert not is_well_formed("3+4=7;7-9=-2;") and not is_well_formed("3+4=7A:7") and not is_well_formed("A:")
    # Truncated chains score 0 on both components.
    assert format_reward(task, "3+4=7;7-") == 0.0 and correctness(task, "3+4=7;7-") == 0.0
    total, parts = score(domain, task, right, {"correctness": 1.0, "format": 0.1})
    assert parts == {"correctness": 1.0, "format": 1.0, "closeness": 1.0} and abs(total - 1.1) < 1e-12
    near = f"A:{int(task.answer) + 3}"
    assert closeness(task, near) == 0.7 and closeness(task, f"A:{int(task.answer) - 12}") == 0.0
    assert closeness(task, "3+4=7;7-") == 0.0


@given(
    st.lists(st.integers(0, 999), min_size=2, max_size=6),
    st.lists(st.sampled_from("+-"), min_size=5, max_size=5),
)
def test_chain_of_any_expression_evaluates_to_its_value(operands: list[int], ops: list[str]) -> None:
    from engine.domains.base import Task

    expr = str(operands[0]) + "".join(f"{o}{x}" for o, x in zip(ops, operands[1:], strict=False))
    value = eval(expr)  # noqa: S307 - digits and +/- only
    domain = MathDomain(MathDomainConfig(train_size=1, val_size=1))
    task = Task("t", f"Q:{expr}\n", str(value), "x")
    chain = domain.demonstration(task)
    assert domain.is_correct(task, chain) and is_well_formed(chain)
