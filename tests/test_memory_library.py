"""The coach's literature retrieval and skill library (no training, no model: files in tmp_path)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from engine.coach.literature import Hit, Literature
from engine.coach.skills import MAX_SLUG, SkillCard, SkillCardError, SkillLibrary, slugify

REPO = Path(__file__).parents[1]
SAMPLE = REPO / "sample_workspace"

NOTES = {
    "dapo.md": """# DAPO

## Dynamic sampling

Groups whose samples all get the same reward have zero variance and zero advantage. Drop those
dead groups and refill the batch so that every group carries a gradient.

## Clip-higher

Raise the upper clip epsilon_high so rare tokens can grow and entropy does not collapse.
""",
    "leaks.md": """# Leaks in agentic environments

## Git history

The agent runs git log and copies the fix from a later commit in the repository history.
Remove the history and evaluate in a clean environment.
""",
    "kl.md": """# KL and learning rate

## Learning rate

A learning rate that is too high makes reward spike and collapse; halve it.
""",
}


def write_notes(root: Path, notes: dict[str, str] = NOTES) -> Path:
    folder = root / "literature"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in notes.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


# -- literature -------------------------------------------------------------------------------------
def test_search_finds_the_relevant_passage(tmp_path: Path) -> None:
    write_notes(tmp_path)
    lit = Literature(tmp_path)

    hits = lit.search("dead groups zero variance filter", k=3)
    assert hits, "expected at least one hit"
    assert hits[0].doc == "literature/dapo.md"
    assert hits[0].title == "DAPO / Dynamic sampling"  # the passage, not the note's other section
    assert "zero variance" in hits[0].excerpt
    assert all(isinstance(h, Hit) and h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    leak = lit.search("policy copies the fix from git history", k=3)
    assert leak[0].doc == "literature/leaks.md"
    assert leak[0].title == "Leaks in agentic environments / Git history"
    assert set(leak[0].to_dict()) == {"doc", "title", "score", "excerpt"}


def test_search_returns_only_positive_scores_and_respects_k(tmp_path: Path) -> None:
    write_notes(tmp_path)
    lit = Literature(tmp_path)
    # Only one passage mentions the learning rate: the others score 0 and must not be returned.
    hits = lit.search("learning rate", k=10)
    assert [h.title for h in hits] == ["KL and learning rate / Learning rate"]
    assert len(lit.search("groups clip history rate reward", k=2)) == 2
    assert lit.search("the and of it", k=3) == []  # stopwords only
    assert lit.search("xylophone", k=3) == []  # unknown words
    assert lit.search("", k=3) == []
    assert lit.search("dead groups", k=0) == []


def test_missing_or_empty_folder_is_an_empty_corpus(tmp_path: Path) -> None:
    assert Literature(tmp_path / "nowhere").search("dead groups") == []
    assert Literature(tmp_path).search("dead groups") == []
    (tmp_path / "literature").mkdir()
    assert Literature(tmp_path).search("dead groups") == []
    (tmp_path / "literature" / "empty.md").write_text("", encoding="utf-8")
    (tmp_path / "literature" / "stop.md").write_text("# The\n\n## Of\n\nthe and of\n", encoding="utf-8")
    assert Literature(tmp_path).search("dead groups") == []


def test_edited_file_is_reindexed(tmp_path: Path) -> None:
    folder = write_notes(tmp_path)
    lit = Literature(tmp_path)
    assert lit.search("tokenizer mismatch vocabulary") == []

    note = folder / "kl.md"
    note.write_text(NOTES["kl.md"] + "\n## Tokenizer\n\nA tokenizer mismatch corrupts the vocabulary.\n", "utf-8")
    st = note.stat()
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # coarse-mtime filesystems
    hits = lit.search("tokenizer mismatch vocabulary")
    assert [h.title for h in hits] == ["KL and learning rate / Tokenizer"]

    (folder / "new.md").write_text("# Echo trap\n\n## Symptoms\n\nRepetitive agent turns.\n", "utf-8")
    assert lit.search("echo trap repetitive")[0].doc == "literature/new.md"

    note.unlink()
    assert lit.search("tokenizer mismatch vocabulary") == []


def test_non_utf8_file_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = write_notes(tmp_path)
    (folder / "latin1.md").write_bytes("# Caf\xe9\n\n## Dead groups\n\nzero variance caf\xe9\n".encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="engine.coach.literature"):
        hits = Literature(tmp_path).search("dead groups zero variance", k=5)
    assert hits and all(h.doc != "literature/latin1.md" for h in hits)
    assert any("literature/latin1.md" in r.getMessage() for r in caplog.records)


def test_excerpt_is_trimmed_and_sections_split(tmp_path: Path) -> None:
    long_text = "# Long\n\nIntro about groups.\n\n## Body\n\n" + "variance " * 200 + "\n\n## Other\n\nunrelated words\n"
    write_notes(tmp_path, {"long.md": long_text})
    hits = Literature(tmp_path).search("variance", k=3)
    assert [h.title for h in hits] == ["Long / Body"]
    assert len(hits[0].excerpt) <= 410 and hits[0].excerpt.endswith("…")
    intro = Literature(tmp_path).search("intro", k=3)
    assert [h.title for h in intro] == ["Long"]  # text before the first ## is the note's own passage


def test_shipped_literature_answers_the_coach_questions() -> None:
    folder = SAMPLE / "literature"
    notes = sorted(folder.glob("*.md"))
    assert 6 <= len(notes) <= 8
    for note in notes:
        text = note.read_text(encoding="utf-8")
        assert text.startswith("# ") and "\n## " in text, note.name
        assert 150 <= len(text.split()) <= 420, note.name

    lit = Literature(SAMPLE)
    top = [h.doc for h in lit.search("dead groups zero variance filter", k=3)]
    assert {"literature/ragen-filtering.md", "literature/dapo.md"} & set(top)
    assert lit.search("policy copies the fix from git history", k=3)[0].doc == "literature/agentic-leaks.md"
    assert lit.search("shaped reward rises while binary correctness is flat", k=3)[0].doc == (
        "literature/reward-shaping.md"
    )
    assert lit.search("long wrong answers length normalization", k=3)[0].doc == "literature/dr-grpo.md"
    assert lit.search("entropy collapse learning rate", k=3)[0].doc == "literature/kl-lr-entropy.md"
    assert lit.search("echo trap multi-turn agent", k=3)[0].title.endswith("/ The echo trap")
    assert lit.search("one-step no-op submission efficiency", k=3)[0].doc == "literature/reward-shaping.md"


# -- skills -----------------------------------------------------------------------------------------
def make_card(**overrides: object) -> SkillCard:
    data: dict[str, object] = {
        "id": "insufficient-signal-continuous-correctness",
        "title": "Continuous correctness when groups are dead",
        "trigger": ["insufficient_signal", "dead_training"],
        "intervention": {
            "kind": "reward",
            "template": "continuous_correctness",
            "changes": {"recipe.rewards": {"correctness": 1.0, "format": 0.1, "closeness": 0.5}},
        },
        "expected_outcome": "fewer dead groups; val correctness rises",
        "validation": [validation("v2", "math")],
        "domains": ["math"],
        "body": "## Why it works\n\nA continuous component gives uniform groups a spread.\n\n---\n\nEvidence: v2.",
    }
    data.update(overrides)
    return SkillCard.model_validate(data)


def validation(version: str, domain: str, delta: float | None = 0.05) -> dict[str, object]:
    return {
        "version": version,
        "parent": "v0",
        "verdict": "improved",
        "delta_greedy": delta,
        "delta_sampled": 0.03,
        "domain": domain,
        "date": "2025-06-01",
    }


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    card = make_card()
    path = lib.write(card)
    assert path == tmp_path / "skills" / "insufficient-signal-continuous-correctness.md"
    assert path.read_text(encoding="utf-8").startswith("---\nid: insufficient-signal-continuous-correctness\n")
    assert lib.load() == [card]
    assert lib.load()[0].to_dict() == card.to_dict()
    assert card.to_dict()["validation"][0]["date"] == "2025-06-01"  # a string, not a YAML date
    assert list(tmp_path.joinpath("skills").iterdir()) == [path]  # no temp file left behind


def test_writing_the_same_skill_twice_merges(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    lib.write(make_card())
    again = make_card(
        id="another-name-for-it",
        trigger=["dead_training", "insufficient_signal"],  # same set, other order
        validation=[validation("v7", "code", delta=0.02)],
        domains=["code"],
    )
    path = lib.write(again)
    assert path.name == "insufficient-signal-continuous-correctness.md"
    cards = lib.load()
    assert len(cards) == 1
    assert [v["version"] for v in cards[0].validation] == ["v2", "v7"]
    assert cards[0].domains == ["math", "code"]
    # Recording the same version again replaces its entry instead of duplicating it.
    lib.write(make_card(validation=[validation("v7", "code", delta=0.04)], domains=["code"]))
    (card,) = lib.load()
    assert [(v["version"], v["delta_greedy"]) for v in card.validation] == [("v2", 0.05), ("v7", 0.04)]


def test_a_different_skill_with_a_taken_id_gets_its_own_file(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    lib.write(make_card())
    other = make_card(intervention={"kind": "filter", "template": "group_filter", "changes": {}})
    path = lib.write(other)
    assert path.name == "insufficient-signal-continuous-correctness-2.md"
    assert sorted(c.id for c in lib.load()) == [
        "insufficient-signal-continuous-correctness",
        "insufficient-signal-continuous-correctness-2",
    ]


def test_match_own_domain_and_cross_domain(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    lib.write(make_card())  # math, matches two rules
    lib.write(
        make_card(
            id="more-generations",
            trigger=["insufficient_signal"],
            intervention={"kind": "optimizer", "template": "more_generations", "changes": {}},
            validation=[validation("v3", "math"), validation("v5", "math")],
        )
    )
    lib.write(
        make_card(
            id="group-filter-code",
            trigger=["insufficient_signal"],
            intervention={"kind": "filter", "template": "group_filter", "changes": {}},
            validation=[validation("v4", "code")],
            domains=["code"],
        )
    )
    lib.write(
        make_card(
            id="longer-training",
            trigger=[],
            intervention={"kind": "budget", "template": "longer_training", "changes": {}},
        )
    )

    own = lib.match(["insufficient_signal", "dead_training"], "math")
    # Two rules matched beats one rule with more validations.
    assert [c.id for c in own] == ["insufficient-signal-continuous-correctness", "more-generations"]
    assert [c.id for c in lib.match(["insufficient_signal"], "math")] == [
        "more-generations",  # same rule count: more validations first
        "insufficient-signal-continuous-correctness",
    ]
    assert [c.id for c in lib.match(["insufficient_signal"], "math", cross_domain=True)] == ["group-filter-code"]
    assert [c.id for c in lib.match(["insufficient_signal"], "code")] == ["group-filter-code"]
    assert lib.match(["reward_hacking"], "math") == []
    assert [c.id for c in lib.match([], "math")] == ["longer-training"]  # general cards when no rule fired
    assert lib.match([], "math", cross_domain=True) == []


GOOD_CARD = """---
id: broken-card
title: A hand-written card
trigger: []
intervention: {kind: reward, template: continuous_correctness, changes: {}}
expected_outcome: something
validation: []
domains: [math]
---

Body.
"""
BAD_CARD = GOOD_CARD.replace("trigger: []", "trigger: insufficient_signal")  # a string, not a list


def edit(old: str, new: str) -> str:
    """GOOD_CARD with one change (asserts the change applied, so a case cannot silently test nothing)."""
    assert old in GOOD_CARD
    return GOOD_CARD.replace(old, new)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (GOOD_CARD, None),
        (BAD_CARD, "trigger"),
        (edit("expected_outcome: something\n", ""), "expected_outcome"),
        (edit("domains: [math]\n", "domains: [math]\ncolour: red\n"), "colour"),
        (edit("kind: reward", "kind: magic"), "intervention"),
        (edit("template: continuous_correctness, ", ""), "intervention"),
        (edit("validation: []", "validation: [{version: v1}]"), "validation"),
        (edit("id: broken-card", "id: Broken Card"), "id"),
        (edit("id: broken-card", "id: other"), "id"),
        (edit("title: A hand-written card", "title: [unclosed"), "front matter"),
        ("Just text, no front matter.\n", "front matter"),
    ],
)
def test_bad_card_names_file_and_field(tmp_path: Path, text: str, field: str | None) -> None:
    folder = tmp_path / "skills"
    folder.mkdir()
    path = folder / "broken-card.md"
    path.write_text(text, encoding="utf-8")
    lib = SkillLibrary(tmp_path)
    if field is None:
        assert [c.id for c in lib.load()] == ["broken-card"]
        return
    with pytest.raises(SkillCardError) as info:
        lib.load()
    assert info.value.field == field
    assert info.value.path == path
    message = str(info.value)
    assert str(path) in message and f"`{field}`" in message


def test_load_valid_reports_bad_cards_without_raising(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    lib.write(make_card())
    bad = tmp_path / "skills" / "broken-card.md"
    bad.write_text(BAD_CARD, encoding="utf-8")
    (tmp_path / "skills" / "latin.md").write_bytes("---\nid: latin\ntitle: caf\xe9\n---\n".encode("latin-1"))

    cards, errors = lib.load_valid()
    assert [c.id for c in cards] == ["insufficient-signal-continuous-correctness"]
    assert len(errors) == 2
    assert any("broken-card.md" in e and "`trigger`" in e for e in errors)
    assert any("latin.md" in e and "UTF-8" in e for e in errors)
    # The coach's reads keep working around the bad cards, and a write never overwrites one.
    assert [c.id for c in lib.match(["insufficient_signal"], "math")] == ["insufficient-signal-continuous-correctness"]
    assert lib.write(make_card(id="broken-card", trigger=["over_filtering"])).name == "broken-card-2.md"
    assert bad.read_text(encoding="utf-8") == BAD_CARD


def test_missing_library_is_empty(tmp_path: Path) -> None:
    lib = SkillLibrary(tmp_path)
    assert lib.load() == [] and lib.load_valid() == ([], []) and lib.match(["x"], "math") == []


def test_card_fields_are_normalized_and_slugs_are_safe() -> None:
    card = make_card(trigger=["", "insufficient_signal", "insufficient_signal"], title="  Padded  ")
    assert card.trigger == ["insufficient_signal"] and card.title == "Padded"
    with pytest.raises(ValueError):
        make_card(id="../escape")
    with pytest.raises(ValueError):
        make_card(title="   ")
    with pytest.raises(ValueError):
        make_card(validation=[validation("v1", "math", delta=float("nan"))])
    assert slugify("Insufficient signal: continuous correctness!") == "insufficient-signal-continuous-correctness"
    assert slugify("../../etc") == "etc" and slugify("***") == "skill"
    assert len(slugify("word-" * 100)) <= MAX_SLUG
    with pytest.raises(ValueError):
        make_card(id="a" * (MAX_SLUG + 1))
