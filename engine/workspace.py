"""A workspace: one training project, a directory that is its own git repository.

Layout::

    <ws>/workspace.toml          the configuration (domain, policy, recipe, budget, gates)
    <ws>/.evotrainer/            engine state, never committed
        evo.duckdb               the store (opened only by the engine)
        models/vN/               checkpoints (v0: the warmed-up base policy)
        runs/<run id>/           run directories (spec, event log, rollouts, worker log)
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import engine
from engine.config import CONFIG_FILE, STATE_DIR, WorkspaceConfig, load_config
from engine.domains import make_domain
from engine.versions import VersionTree

#: "sample" is the math workspace; the others are the same workspace with the `workspace.toml`
#: of `variants/<name>.toml` (another domain, sized to train on this kind of machine).
TEMPLATES = ("sample", "code", "swe", "dataset")
#: Where the dataset template's data and model go in a new workspace (the model is not versioned).
DATA_DIR, MODEL_DIR = "data", "model"
VARIANTS_DIR = "variants"


class WorkspaceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def db_path(self) -> Path:
        return self.state_dir / "evo.duckdb"

    @property
    def models_dir(self) -> Path:
        return self.state_dir / "models"

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_FILE

    def model_dir(self, version: str) -> Path:
        return self.models_dir / version

    def load_config(self) -> WorkspaceConfig:
        config = load_config(self.root)
        if config.domain.name == "dataset":
            # The user's data is part of the workspace: reading and checking it here makes a bad
            # row fail when the workspace opens (a DatasetError naming file, line and field),
            # not halfway through the first run.
            make_domain(config.domain, self.root)
        return config

    @classmethod
    def open(cls, root: Path | str) -> Workspace:
        root = Path(root).expanduser().resolve()
        if not (root / CONFIG_FILE).is_file():
            raise WorkspaceError(f"{root} is not a workspace (no {CONFIG_FILE}); create one with `evotui init {root}`")
        return cls(root)


def template_dir(name: str) -> Path:
    """A template shipped with evotui: inside an installed wheel, or `sample_workspace/` in a checkout."""
    if name not in TEMPLATES:
        raise WorkspaceError(f"unknown template {name!r}; available: {', '.join(TEMPLATES)}")
    package = Path(engine.__file__).resolve().parent
    for candidate in (package / "templates" / "sample", package.parent / "sample_workspace"):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    raise WorkspaceError(f"template {name!r} is missing from this installation ({package})")


def _dataset_template(source: Path, dest: Path) -> None:
    """The dataset template's files: its JSONL under data/, and a small Hugging Face model built
    here (random weights, a BPE tokenizer trained on the data, a chat template) under model/."""
    import json

    from engine.policy.scratch import build_scratch_model

    shutil.copytree(source, dest / DATA_DIR, dirs_exist_ok=True)
    texts = []
    for file in sorted((dest / DATA_DIR).glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts += [row["prompt"], row["solution"]]
    build_scratch_model(dest / MODEL_DIR, texts)


def init_workspace(dest: Path | str, template: str = "sample") -> Workspace:
    """Copy a template into `dest` (new or empty) and make it its own git repository."""
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and any(dest.iterdir()):
        raise WorkspaceError(f"{dest} exists and is not empty; choose a new directory")
    source = template_dir(template)
    ignore = shutil.ignore_patterns(STATE_DIR, "__pycache__", VARIANTS_DIR)
    shutil.copytree(source, dest, dirs_exist_ok=True, ignore=ignore)
    if template != "sample":
        variant = source / VARIANTS_DIR / f"{template}.toml"
        if not variant.is_file():
            raise WorkspaceError(f"template {template!r} is missing from this installation ({variant})")
        shutil.copyfile(variant, dest / CONFIG_FILE)
    ignored = [f"{STATE_DIR}/"]
    if template == "dataset":
        _dataset_template(source / VARIANTS_DIR / "dataset", dest)
        ignored.append(f"{MODEL_DIR}/")
    gitignore = dest / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    gitignore.write_text("\n".join([*lines, *(entry for entry in ignored if entry not in lines), ""]))
    workspace = Workspace(dest)
    workspace.load_config()  # a template that does not validate must not become a workspace
    VersionTree.init(dest, message=f"Create workspace from template '{template}'")
    return workspace
