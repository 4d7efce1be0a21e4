"""Loading the harness: built-in analyzers and rules plus those in ``<ws>/harness/*.py``.

A workspace file uses the same decorators as the built-ins::

    from engine.harness import Finding, analyzer

    @analyzer("short_answers", "behavior")
    def short_answers(ctx):
        (share,) = ctx.q1("SELECT avg((completion_length < 5)::INT) FROM rollouts WHERE run_id = $run")
        return Finding("behavior.short_answer_share", share)

A file that does not import, or an analyzer that raises, becomes a finding that says so (file,
line, error); the diagnosis goes on without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import engine.harness.analyzers  # noqa: F401 - registers the built-in analyzers
import engine.harness.rules  # noqa: F401 - registers the built-in rules
from engine import __version__
from engine.harness import base
from engine.harness.base import Analyzer, Finding, Rule

HARNESS_DIR = "harness"

#: The layers a harness diagnoses with (None: every layer).
Layers = tuple[str, ...] | None
#: What `[coach] harness` and `--harness` mean: `score-only` is the ablation of the other layers.
MODE_LAYERS: dict[str, Layers] = {"full": None, "score-only": ("score",)}


@dataclass
class Harness:
    analyzers: list[Analyzer]
    rules: list[Rule]
    #: Findings about the harness itself (a workspace file that failed to load).
    problems: list[Finding] = field(default_factory=list)
    revision: str = f"built-in {__version__}"

    def only(self, layers: Sequence[str]) -> Harness:
        """The same harness with the analyzers of `layers` alone (rules stay: without their
        findings they cannot fire). `--harness score-only` is the ablation of the other layers."""
        return Harness(
            [a for a in self.analyzers if a.layer in layers],
            list(self.rules),
            list(self.problems),
            f"{self.revision} (layers: {', '.join(layers)})",
        )


def error_location(exc: BaseException, file: Path) -> str:
    """'file:line' of the deepest frame in `file` (or of a syntax error in it)."""
    if isinstance(exc, SyntaxError) and exc.lineno is not None:
        return f"{file}:{exc.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == file]
    return f"{file}:{lines[-1]}" if lines else str(file)


def broken(kind: str, name: str, file: Path, exc: BaseException) -> Finding:
    return Finding(
        f"harness.broken.{name}",
        None,
        "warning",
        f"{kind} {name} is broken at {error_location(exc, file)}: {type(exc).__name__}: {exc}",
        analyzer=name,
        layer="version",
        provenance="workspace",
    )


def load_harness(workspace_root: Path | None) -> Harness:
    harness = Harness(list(base.BUILTIN_ANALYZERS), list(base.BUILTIN_RULES))
    folder = workspace_root / HARNESS_DIR if workspace_root is not None else None
    if folder is None or not folder.is_dir():
        return harness
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        collected: tuple[list[Analyzer], list[Rule]] = ([], [])
        base._collecting.append(collected)
        try:
            spec = importlib.util.spec_from_file_location(f"evotrainer_harness_{path.stem}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - a broken file is a finding, not a crash
            harness.problems.append(broken("harness file", path.stem, path.resolve(), exc))
            continue
        finally:
            base._collecting.pop()
        resolved = str(path.resolve())
        harness.analyzers += [replace(a, provenance="workspace", source=resolved) for a in collected[0]]
        harness.rules += [replace(r, provenance="workspace", source=resolved) for r in collected[1]]
    harness.revision += f" + workspace {digest.hexdigest()[:12]}"
    return harness
