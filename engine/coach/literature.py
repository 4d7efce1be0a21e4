"""Literature memory: BM25 retrieval over a workspace's notes in ``<workspace>/literature/*.md``.

The coach asks for guidance on the bottleneck a diagnosis names ("dead groups", "reward hacking")
and hands the hits to its backend as background. Notes are split into passages at their ``##``
headings and each passage is indexed on its own, because a whole note mixes several topics: the
excerpt a backend reads should be the part that matched, not the note's first lines.

Retrieval is lexical (``bm25s``, English stopwords, a light suffix stemmer so "groups" finds
"group" and "filtering" finds "filter"). It never raises on bad input files: the coach must keep
planning when a note is unreadable, so such files are skipped with a logged warning.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import bm25s

log = logging.getLogger(__name__)

#: Folder of a workspace that holds the notes.
LITERATURE_DIR = "literature"
#: Rough length of an excerpt handed to a backend (whole words, then an ellipsis).
EXCERPT_CHARS = 400

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    doc: str  # path relative to the workspace, e.g. "literature/dapo.md"
    title: str  # "<note title> / <section>" (just the note title for text before the first section)
    score: float
    excerpt: str  # the passage text, trimmed to about EXCERPT_CHARS characters

    def to_dict(self) -> dict[str, object]:
        """The shape `PlanningContext.literature` carries: {doc, title, score, excerpt}."""
        return {"doc": self.doc, "title": self.title, "score": self.score, "excerpt": self.excerpt}


@dataclass(frozen=True)
class _Passage:
    doc: str
    title: str
    text: str


def _stem_word(word: str) -> str:
    """A deliberately light English suffix stripper.

    PyStemmer is not a dependency; without any stemming "groups" would not match "group" and
    "filtering" would not match "filter", which matters more in a small corpus than precision.
    It only needs to map inflections of one word to one key, not produce real stems.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]  # dropped -> drop, but fill stays fill
            break
    else:
        if word.endswith(("sses", "xes", "zes", "ches", "shes", "ses")):
            word = word[:-2]
        elif word.endswith("s") and not word.endswith(("ss", "us", "is", "as")):
            word = word[:-1]
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def _stem(words: list[str]) -> list[str]:
    """The callable form ``bm25s.tokenize(stemmer=...)`` expects: a list of words in, stems out."""
    return [_stem_word(w) for w in words]


def _tokenize(texts: list[str]) -> list[list[str]]:
    """Tokens as strings, so corpus and query share one vocabulary by spelling, not by id."""
    return bm25s.tokenize(texts, stopwords="en", stemmer=_stem, return_ids=False, show_progress=False)


def split_passages(text: str, doc: str, fallback_title: str) -> list[_Passage]:
    """Split a note at its ``##`` headings; deeper headings stay inside their section.

    The first ``#`` heading is the note's title (the file stem when there is none). Text before
    the first section is a passage titled by the note alone. Headings inside fenced code blocks
    are not headings.
    """
    title = fallback_title
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    in_fence = False
    seen_title = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match and len(match.group(1)) == 1 and not seen_title:
            title, seen_title = match.group(2) or fallback_title, True
            continue
        if match and len(match.group(1)) == 2:
            sections.append((match.group(2), []))
            continue
        sections[-1][1].append(line)
    passages = []
    for heading, lines in sections:
        body = "\n".join(lines).strip()
        if heading is None and not body:
            continue
        passages.append(_Passage(doc=doc, title=f"{title} / {heading}" if heading else title, text=body))
    return passages


def _excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """Whitespace collapsed and cut at a word boundary, so a backend prompt stays small."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:") + " …"


class Literature:
    """Search over ``<workspace>/literature/*.md``; a missing folder is an empty corpus."""

    def __init__(self, workspace_root: Path) -> None:
        self.root = Path(workspace_root)
        self.folder = self.root / LITERATURE_DIR
        self._lock = threading.Lock()
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._passages: list[_Passage] = []
        self._retriever: bm25s.BM25 | None = None

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The best `k` passages with a positive score, best first.

        A query of only stopwords or of words no note contains returns [] rather than arbitrary
        zero-score passages, so "no hits" means the corpus has nothing on the topic.
        """
        if k <= 0 or not query.strip():
            return []
        with self._lock:
            self._refresh()
            retriever, passages = self._retriever, self._passages
        if retriever is None or not passages:
            return []
        tokens = _tokenize([query])
        if not tokens[0]:
            return []
        # bm25s refuses k larger than the corpus, so clamp it.
        docs, scores = retriever.retrieve(tokens, k=min(k, len(passages)), show_progress=False)
        ranked = sorted(zip(docs[0].tolist(), scores[0].tolist(), strict=True), key=lambda p: (-p[1], p[0]))
        return [
            Hit(doc=passages[i].doc, title=passages[i].title, score=float(s), excerpt=_excerpt(passages[i].text))
            for i, s in ranked
            if s > 0
        ]

    # -- index ------------------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob("*.md") if p.is_file())

    def _current_signature(self, files: list[Path]) -> tuple[tuple[str, int, int], ...]:
        """Names, mtimes and sizes: an edit, an added or a removed note changes it."""
        out = []
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((path.name, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _refresh(self) -> None:
        """(Re)build the index when the folder changed since the last build (lazily, on search)."""
        files = self._files()
        signature = self._current_signature(files)
        if signature == self._signature:
            return
        self._signature = signature
        passages: list[_Passage] = []
        for path in files:
            rel = path.relative_to(self.root).as_posix()
            try:
                text = path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                log.warning("literature: skipping %s: not UTF-8 text (%s)", rel, exc.reason)
                continue
            except OSError as exc:
                log.warning("literature: skipping %s: cannot read it (%s)", rel, exc.strerror or exc)
                continue
            passages.extend(split_passages(text, rel, path.stem))
        self._passages, self._retriever = passages, None
        if not passages:
            return
        # The title and heading are indexed with the text: a section's heading is its best summary.
        corpus_tokens = _tokenize([f"{p.title}\n{p.text}" for p in passages])
        if not any(corpus_tokens):
            # bm25s cannot index an empty vocabulary (it fails on max() of nothing).
            return
        retriever = bm25s.BM25()
        retriever.index(corpus_tokens, show_progress=False)
        self._retriever = retriever
