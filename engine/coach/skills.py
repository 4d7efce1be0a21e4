"""Skill library: interventions that worked, kept as Markdown cards in ``<workspace>/skills/<id>.md``.

A skill card records one intervention (a catalog template and its changes) together with the
rules that made it relevant and every version that validated it. The coach consults the library
before its catalog: a card validated in the current domain is stronger evidence than a template
that merely fits the diagnosis, and a card validated only in other domains is the fallback when
no card of this domain matches (its template is re-applied to this domain's config). Cards are
Markdown with YAML front matter so a person can read, edit or delete them; that is also why a
broken card must produce an error naming the file and the field, and why the coach's own reads
(`load_valid`, `match`) never raise.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import frontmatter
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.coach.interventions import KINDS, Intervention
from engine.verdict import Verdict

#: Folder of a workspace that holds the cards.
SKILLS_DIR = "skills"
#: A card id is its file name: lowercase letters, digits and single hyphens, so it is safe on any filesystem.
SLUG_PATTERN = r"^[a-z0-9]+(?:-[a-z0-9]+)*$"
MAX_SLUG = 200  # well under the usual 255-byte file-name limit, with ".md" and a temp-file prefix
#: The keys every validation entry carries (one entry per validating version).
VALIDATION_KEYS = ("version", "parent", "verdict", "delta_greedy", "delta_sampled", "domain", "date")

_SLUG_RE = re.compile(SLUG_PATTERN)


class SkillCardError(ValueError):
    """A skill card that cannot be read or validated; the message names the file, the field and the fix."""

    def __init__(self, path: Path, field: str, problem: str, fix: str) -> None:
        self.path = path
        self.field = field
        super().__init__(f"skill card {path}: field `{field}`: {problem}; {fix}")


def slugify(text: str, max_length: int = MAX_SLUG) -> str:
    """A card id from free text ("Insufficient signal: continuous correctness" ->
    "insufficient-signal-continuous-correctness"); never empty, never longer than `max_length`."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) > max_length:
        slug = slug[:max_length].rsplit("-", 1)[0] if "-" in slug[:max_length] else slug[:max_length]
    return slug.strip("-") or "skill"


class _Validation(BaseModel):
    """Shape check of one validation entry (stored as a plain dict on the card)."""

    model_config = ConfigDict(extra="allow")

    version: str = Field(min_length=1)
    parent: str | None
    verdict: str = Field(min_length=1)
    delta_greedy: float | None
    delta_sampled: float | None
    domain: str = Field(min_length=1)
    date: str = Field(min_length=1, description="ISO date, e.g. '2025-06-01'")

    @field_validator("date", mode="before")
    @classmethod
    def _iso_date(cls, value: Any) -> Any:
        # YAML reads an unquoted 2025-06-01 as a date; a hand-edited card should still load.
        return value.isoformat() if isinstance(value, dt.date) else value

    @field_validator("delta_greedy", "delta_sampled")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        # NaN would break equality (and so the exact round-trip through the file).
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number or null")
        return value


class SkillCard(BaseModel):
    """One skill: an intervention, when it applies, what it should do, and where it was validated."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=SLUG_PATTERN, max_length=MAX_SLUG, description="slug; also the file name")
    title: str = Field(min_length=1)
    trigger: list[str] = Field(description="rule names that make it relevant; [] = general (no rule fired)")
    intervention: dict[str, Any] = Field(description="{kind, template, changes}")
    expected_outcome: str = Field(min_length=1)
    validation: list[dict[str, Any]] = Field(description="one entry per validating version")
    domains: list[str] = Field(description="domains where it was validated")
    body: str = ""

    @field_validator("title", "expected_outcome", "body", mode="before")
    @classmethod
    def _strip(cls, value: Any) -> Any:
        # The file format strips surrounding whitespace; stripping here keeps write/load exact
        # (and before the length check, so a blank title is an error).
        return value.strip() if isinstance(value, str) else value

    @field_validator("trigger", "domains")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for name in value:
            name = name.strip()
            # "" is the catalog's "no rule fired"; on a card that is spelled as an empty trigger list.
            if name and name not in out:
                out.append(name)
        return out

    @field_validator("intervention")
    @classmethod
    def _intervention(cls, value: dict[str, Any]) -> dict[str, Any]:
        kind = value.get("kind")
        if kind not in KINDS:
            raise ValueError(f"needs `kind`, one of {', '.join(KINDS)} (got {kind!r})")
        if not isinstance(value.get("template"), str):
            raise ValueError("needs `template`: the catalog template name ('' when a model wrote the change)")
        if not isinstance(value.get("changes", {}), dict):
            raise ValueError("`changes` must be a mapping of dotted workspace.toml paths to values")
        return value

    @field_validator("validation")
    @classmethod
    def _validation(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for i, entry in enumerate(value):
            missing = [k for k in VALIDATION_KEYS if k not in entry]
            if missing:
                raise ValueError(f"entry {i} lacks {', '.join(missing)} (each entry has {', '.join(VALIDATION_KEYS)})")
            try:
                out.append(_Validation.model_validate(entry).model_dump())
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"entry {i} field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        return out

    def validated_domains(self) -> list[str]:
        """Domains named in `domains` or by a validation entry (the two should agree; either counts)."""
        out = list(self.domains)
        for entry in self.validation:
            if entry["domain"] not in out:
                out.append(entry["domain"])
        return out

    @property
    def standing(self) -> list[dict[str, Any]]:
        """The validation entries not retracted: the evidence the card still stands on."""
        return [entry for entry in self.validation if not entry.get("retracted")]

    @property
    def retracted(self) -> bool:
        """Every version that validated the card was flagged after its decision: the card is kept
        (a person can read why) and never retrieved."""
        return not self.standing

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (what `PlanningContext.skills` carries)."""
        return self.model_dump(mode="json")


def card_from_promotion(
    version: str,
    parent: str,
    iv: Intervention,
    trigger: Sequence[str],
    verdict: Verdict,
    domain: str,
    against: Verdict | None = None,
) -> SkillCard:
    """The card a promotion writes: intervention `iv` (from `parent` to `version`) validated once
    by `verdict`, relevant when the rules `trigger` fire (none: a general improvement). `against`
    is the version against the round's control (the parent trained on unchanged): the card names
    the control and credits the factor with that gain; without one it says "no control"."""
    rules = sorted(set(trigger))
    deltas = {d.decoding: d.diff for d in verdict.deltas}
    control = against.primary_delta if against is not None else None
    if against is not None and control is not None:
        credit = (
            f"; against the control {against.parent}: {control.decoding} {control.diff:+.3f}"
            f" (95% {control.low:+.3f} to {control.high:+.3f})"
        )
    else:
        credit = "; no control (its gain over the parent includes the extra training)"
    return SkillCard(
        id=slugify(f"{'-'.join(rules) or 'general'}-{iv.template or iv.factor}"),
        title=f"{iv.title()} when {', '.join(rules) or 'no rule fires'}",
        trigger=rules,
        intervention={"kind": iv.kind, "template": iv.template, "changes": iv.changes},
        expected_outcome="val correctness "
        + ", ".join(f"{k} {v:+.3f}" for k, v in deltas.items())
        + credit
        + " (one validation)",
        validation=[
            {
                "version": version,
                "parent": parent,
                "verdict": verdict.label,
                "delta_greedy": deltas.get("greedy"),
                "delta_sampled": deltas.get("sampled"),
                "control": against.parent if against is not None else None,
                "control_delta": control.diff if control is not None else None,
                "control_low": control.low if control is not None else None,
                "control_high": control.high if control is not None else None,
                "domain": domain,
                "date": dt.date.today().isoformat(),
            }
        ],
        domains=[domain],
        body=f"Hypothesis: {iv.hypothesis}\n\nEvidence: {', '.join(iv.evidence) or 'none recorded'}\n",
    )


def _merge_key(card: SkillCard) -> tuple[frozenset[str], str]:
    """Two cards are one skill when they answer the same rules with the same intervention.

    The template names the intervention; a model-written change has no template, so its changes
    stand in (otherwise every model-written card for a rule set would collapse into one).
    """
    template = card.intervention.get("template", "")
    if not template:
        template = "changes:" + json.dumps(card.intervention.get("changes", {}), sort_keys=True, default=str)
    return frozenset(card.trigger), template


def _problem_fix(err: dict[str, Any], field: str) -> tuple[str, str]:
    kind = err.get("type", "")
    if kind == "missing":
        return "is missing", f"add `{field}:` to the YAML front matter"
    if kind == "extra_forbidden":
        allowed = ", ".join(k for k in SkillCard.model_fields if k != "body")
        return "is not a skill card field", f"remove or rename it (allowed: {allowed}; the body goes below the ---)"
    msg = str(err.get("msg", "is invalid")).removeprefix("Value error, ")
    return msg, f"fix `{field}` in the YAML front matter"


class SkillLibrary:
    """The cards of one workspace: read, validated, merged and matched against a diagnosis."""

    def __init__(self, workspace_root: Path) -> None:
        self.root = Path(workspace_root)
        self.folder = self.root / SKILLS_DIR

    # -- reading -----------------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob("*.md") if p.is_file())

    def read(self, path: Path) -> SkillCard:
        """One card file; raises SkillCardError naming the file and the field."""
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise SkillCardError(path, "(file)", "is not UTF-8 text", "save the card as UTF-8") from None
        except OSError as exc:
            raise SkillCardError(path, "(file)", f"cannot be read ({exc.strerror or exc})", "check it exists") from None
        if not text.lstrip().startswith("---"):
            raise SkillCardError(
                path, "front matter", "is missing", "start the card with a YAML block between two `---` lines"
            )
        try:
            post = frontmatter.loads(text)
        except yaml.YAMLError as exc:
            problem = " ".join(str(exc).split())
            raise SkillCardError(
                path, "front matter", f"is not valid YAML ({problem})", "fix the YAML syntax"
            ) from None
        meta = dict(post.metadata)
        if not meta:
            raise SkillCardError(path, "front matter", "is empty or not a mapping", "write `field: value` lines")
        if "body" in meta:
            raise SkillCardError(path, "body", "is in the front matter", "put the body text below the closing ---")
        try:
            card = SkillCard.model_validate({**meta, "body": post.content})
        except ValidationError as exc:
            errors = exc.errors()
            first = errors[0]
            field = ".".join(str(p) for p in first["loc"]) or "(card)"
            problem, fix = _problem_fix(first, field)
            if len(errors) > 1:
                others = ", ".join(".".join(str(p) for p in e["loc"]) for e in errors[1:])
                fix += f" (also invalid: {others})"
            raise SkillCardError(path, field, problem, fix) from None
        if card.id != path.stem:
            raise SkillCardError(
                path, "id", f"is {card.id!r} but the file is {path.name}", f"rename the file to {card.id}.md or fix id"
            )
        return card

    def load(self) -> list[SkillCard]:
        """All cards, by file name; the first bad card raises SkillCardError (for `evotui` checks)."""
        return [self.read(path) for path in self._files()]

    def load_valid(self) -> tuple[list[SkillCard], list[str]]:
        """All good cards and one error line per bad card: what the coach uses, so a person's
        half-edited card never stops a run."""
        cards: list[SkillCard] = []
        errors: list[str] = []
        for path in self._files():
            try:
                cards.append(self.read(path))
            except SkillCardError as exc:
                errors.append(str(exc))
        return cards, errors

    # -- writing -----------------------------------------------------------------------------------
    def write(self, card: SkillCard) -> Path:
        """Record a card, merging it into an existing card for the same skill; returns the file.

        Merging appends the new validation entries (an entry for a version and domain already on
        the card replaces the old one, so recording the same version twice is idempotent) and
        unions the domains; title, outcome and body stay as they were, since a person may have
        edited them. A new card whose id is taken by a different skill (or by an unreadable file,
        which is never overwritten) gets a numbered id.
        """
        card = SkillCard.model_validate(card.model_dump())  # re-validate: callers may mutate models
        existing, _ = self.load_valid()
        key = _merge_key(card)
        for old in existing:
            if _merge_key(old) == key:
                return self._save(_merge(old, card))
        return self._save(card.model_copy(update={"id": self._free_id(card.id)}))

    def _free_id(self, wanted: str) -> str:
        if not (self.folder / f"{wanted}.md").exists():
            return wanted
        n = 2
        while True:
            suffix = f"-{n}"
            candidate = wanted[: MAX_SLUG - len(suffix)].rstrip("-") + suffix
            if not (self.folder / f"{candidate}.md").exists():
                return candidate
            n += 1

    def _save(self, card: SkillCard) -> Path:
        """Write atomically, so a crash mid-write never leaves a truncated card behind."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{card.id}.md"
        meta = card.model_dump(mode="json", exclude={"body"})
        text = frontmatter.dumps(frontmatter.Post(card.body, **meta), sort_keys=False) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{card.id}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def retract(self, version: str, reason: str) -> list[str]:
        """Mark every validation entry from `version` retracted, with `reason`; returns the ids of
        the cards touched. A card left with no standing entry is retracted: kept, never matched."""
        touched = []
        for card in self.load_valid()[0]:
            if not any(entry["version"] == version for entry in card.validation):
                continue
            validation = [
                entry | {"retracted": reason} if entry["version"] == version else entry for entry in card.validation
            ]
            self._save(card.model_copy(update={"validation": validation}))
            touched.append(card.id)
        return touched

    # -- matching ----------------------------------------------------------------------------------
    def match(self, rules: Sequence[str], domain: str, *, cross_domain: bool = False) -> list[SkillCard]:
        """Cards relevant to the rules that fired, validated in `domain` (or, with `cross_domain`,
        validated only elsewhere), most rules matched first, then most validations.

        With no rule fired, the general cards (empty trigger) are the relevant ones.
        """
        fired = {r for r in rules if r}
        scored: list[tuple[int, int, str, SkillCard]] = []
        for card in self.load_valid()[0]:
            if card.retracted:
                continue
            if fired:
                hits = len(fired.intersection(card.trigger))
                if not hits:
                    continue
            elif card.trigger:
                continue
            else:
                hits = 0
            domains = card.validated_domains()
            if cross_domain:
                if not domains or domain in domains:
                    continue
            elif domain not in domains:
                continue
            scored.append((-hits, -len(card.standing), card.id, card))
        scored.sort(key=lambda t: t[:3])
        return [t[3] for t in scored]


def _merge(old: SkillCard, new: SkillCard) -> SkillCard:
    validation = [dict(v) for v in old.validation]
    for entry in new.validation:
        same = next(
            (i for i, v in enumerate(validation) if (v["version"], v["domain"]) == (entry["version"], entry["domain"])),
            None,
        )
        if same is None:
            validation.append(dict(entry))
        else:
            validation[same] = dict(entry)
    domains = list(old.domains) + [d for d in new.domains if d not in old.domains]
    return old.model_copy(update={"validation": validation, "domains": domains})
