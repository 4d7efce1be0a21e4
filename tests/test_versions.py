from __future__ import annotations

from pathlib import Path

import git
import pytest

from engine.versions import VersionTree, VersionTreeError


@pytest.fixture
def tree(tmp_path: Path) -> VersionTree:
    (tmp_path / "workspace.toml").write_text("[recipe]\nlearning_rate = 1e-4\n")
    (tmp_path / "notes.md").write_text("notes\n")
    return VersionTree.init(tmp_path)


def test_child_branch_is_committed_without_touching_the_working_tree(tree: VersionTree, tmp_path: Path) -> None:
    tree.create_base("v0")
    (tmp_path / "scratch.txt").write_text("uncommitted work")
    head_before = tree.repo.head.commit.hexsha
    sha = tree.create_child("v0", "v1", {"workspace.toml": "[recipe]\nlearning_rate = 5e-5\n"}, "v1: lower lr")

    assert tree.repo.active_branch.name == "main" and tree.repo.head.commit.hexsha == head_before
    assert (tmp_path / "workspace.toml").read_text() == "[recipe]\nlearning_rate = 1e-4\n"
    assert (tmp_path / "scratch.txt").read_text() == "uncommitted work"
    assert tree.commit_of("v1").hexsha == sha
    assert tree.commit_of("v1").parents[0].hexsha == tree.commit_of("v0").hexsha
    assert tree.read("v1", "workspace.toml").endswith(b"5e-5\n")
    assert tree.read("v1", "notes.md") == b"notes\n"  # untouched files carry over
    assert tree.versions() == ["v0", "v1"]


def test_diff_between_any_two_versions(tree: VersionTree) -> None:
    tree.create_base("v0")
    tree.create_child("v0", "v1", {"workspace.toml": "[recipe]\nlearning_rate = 5e-5\n"}, "v1")
    tree.create_child("v1", "v2", {"reward.md": "continuous\n"}, "v2")
    diff = tree.diff("v0", "v2")
    assert "-learning_rate = 1e-4" in diff and "+learning_rate = 5e-5" in diff and "+continuous" in diff
    assert sorted(tree.changed_files("v1", "v2")) == ["reward.md"]
    assert tree.diff("v1", "v1") == ""
    assert tree.lineage("v2") == ["v0", "v1", "v2"]


def test_promote_and_reject_are_tags_and_rejected_branches_stay(tree: VersionTree) -> None:
    tree.create_base("v0")
    tree.create_child("v0", "v1", {"a.txt": "1"}, "v1")
    tree.create_child("v0", "v2", {"a.txt": "2"}, "v2")
    tree.promote("v1", "improved: +0.08")
    tree.reject("v2", "regressed: -0.05")
    assert tree.decision("v1") == ("promoted", "improved: +0.08")
    assert tree.decision("v2") == ("rejected", "regressed: -0.05")
    assert tree.decision("v0") is None
    assert tree.exists("v2")
    assert "rejected/v2" in git.Repo(tree.repo.working_dir).tags
    with pytest.raises(VersionTreeError, match="already promoted"):
        tree.reject("v1", "changed my mind")


def test_errors_name_the_problem(tree: VersionTree, tmp_path: Path) -> None:
    tree.create_base("v0")
    with pytest.raises(VersionTreeError, match="already exists"):
        tree.create_base("v0")
    with pytest.raises(VersionTreeError, match="no version 'v9'"):
        tree.create_child("v9", "v10", {}, "x")
    with pytest.raises(VersionTreeError, match="not a git repository"):
        VersionTree(tmp_path / "nowhere")
