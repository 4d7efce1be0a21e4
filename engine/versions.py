"""The version tree over the workspace's own git repository (GitPython).

v0 is the base; a child version is a branch ``versions/vN`` from its parent's branch with the
version's change committed. Commits are written straight into the object database, so the
person's working tree and checked-out branch are never touched. Promotion and rejection are
annotated tags (``promoted/vN``, ``rejected/vN``) carrying the reason; rejected branches stay.
"""

from __future__ import annotations

import io
from pathlib import Path

import git
from git import Actor, Blob, Commit, IndexFile
from git.index.typ import BaseIndexEntry
from gitdb import IStream

BRANCH_PREFIX = "versions/"
ACTOR = Actor("evotui", "evotui@localhost")
DECISIONS = ("promoted", "rejected", "pruned")


class VersionTreeError(RuntimeError):
    pass


class VersionTree:
    def __init__(self, root: Path):
        try:
            self.repo = git.Repo(root)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise VersionTreeError(f"{root} is not a git repository; create workspaces with `evotui init`") from None

    @classmethod
    def init(cls, root: Path, message: str = "Create workspace") -> VersionTree:
        """Make `root` its own repository with everything in it as the first commit."""
        repo = git.Repo.init(root, initial_branch="main")
        repo.git.add(A=True)
        repo.index.commit(message, author=ACTOR, committer=ACTOR)
        return cls(root)

    @staticmethod
    def branch(version: str) -> str:
        return f"{BRANCH_PREFIX}{version}"

    def exists(self, version: str) -> bool:
        return self.branch(version) in self.repo.heads

    def versions(self) -> list[str]:
        names = [h.name.removeprefix(BRANCH_PREFIX) for h in self.repo.heads if h.name.startswith(BRANCH_PREFIX)]
        return sorted(names, key=lambda n: int(n[1:]))

    def commit_of(self, version: str) -> Commit:
        if not self.exists(version):
            raise VersionTreeError(f"no version {version!r} (branch {self.branch(version)} does not exist)")
        return self.repo.heads[self.branch(version)].commit

    def create_base(self, version: str = "v0", ref: str = "HEAD") -> str:
        """The base version is a branch at `ref` (by default the workspace's current commit)."""
        if self.exists(version):
            raise VersionTreeError(f"version {version} already exists")
        head = self.repo.create_head(self.branch(version), self.repo.commit(ref))
        return head.commit.hexsha

    def create_child(self, parent: str, child: str, files: dict[str, str], message: str) -> str:
        """Branch `child` from `parent` with `files` (path -> text) written in one commit."""
        if self.exists(child):
            raise VersionTreeError(f"version {child} already exists")
        parent_commit = self.commit_of(parent)
        index = IndexFile.from_tree(self.repo, parent_commit)
        entries = []
        for path, text in files.items():
            data = text.encode("utf-8")
            stored = self.repo.odb.store(IStream(Blob.type, len(data), io.BytesIO(data)))
            entries.append(BaseIndexEntry((0o100644, stored.binsha, 0, path)))
        index.add(entries, write=False)
        tree = index.write_tree()
        commit = Commit.create_from_tree(
            self.repo,
            tree,
            message,
            parent_commits=[parent_commit],
            head=False,
            author=ACTOR,
            committer=ACTOR,
        )
        self.repo.create_head(self.branch(child), commit)
        return commit.hexsha

    def read(self, version: str, path: str) -> bytes:
        """The bytes of a workspace file as `version` has it."""
        blob = self.commit_of(version).tree / path
        return blob.data_stream.read()

    def diff(self, a: str, b: str) -> str:
        """Unified diff of the workspace files from version `a` to version `b`."""
        return self.repo.git.diff(self.commit_of(a).hexsha, self.commit_of(b).hexsha)

    def changed_files(self, a: str, b: str) -> list[str]:
        return [d.b_path or d.a_path for d in self.commit_of(a).diff(self.commit_of(b))]

    def lineage(self, version: str) -> list[str]:
        """Versions from the base down to `version`, following first parents of version commits."""
        by_sha = {self.commit_of(v).hexsha: v for v in self.versions()}
        chain = []
        commit: Commit | None = self.commit_of(version)
        while commit is not None:
            if commit.hexsha in by_sha and (not chain or chain[-1] != by_sha[commit.hexsha]):
                chain.append(by_sha[commit.hexsha])
            commit = commit.parents[0] if commit.parents else None
        return list(reversed(chain))

    def decide(self, kind: str, version: str, reason: str) -> None:
        """Tag `version` with its decision (promoted, rejected, pruned); a version is decided once."""
        for other in DECISIONS:
            if f"{other}/{version}" in self.repo.tags:
                raise VersionTreeError(f"{version} is already {other}")
        self.repo.create_tag(f"{kind}/{version}", ref=self.commit_of(version), message=reason or kind)

    def promote(self, version: str, reason: str) -> None:
        self.decide("promoted", version, reason)

    def reject(self, version: str, reason: str) -> None:
        self.decide("rejected", version, reason)

    def decision(self, version: str) -> tuple[str, str] | None:
        """(decision, reason) if a decision was recorded."""
        for kind in DECISIONS:
            name = f"{kind}/{version}"
            if name in self.repo.tags:
                tag = self.repo.tags[name].tag
                return kind, (tag.message if tag is not None else "")
        return None
