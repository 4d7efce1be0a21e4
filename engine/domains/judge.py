"""The instruction-following judge of an episode: an offline rubric, or Claude when a key is set.

Claude gets the protocol, the issue and the transcript, and must answer through one forced tool
(`score`: a number in [0, 1] and a one-line reason), so there is nothing to parse. Verdicts are
cached by transcript: the samples of a GRPO group often repeat each other. Anything that goes
wrong (no key, an API error, a malformed answer) falls back to the offline rubric for that
episode and is counted, never raised: a reward must not crash a training step. The key comes
from `ANTHROPIC_API_KEY` only, and no error text that could carry it is kept.

The count reaches the user: each training step logs the share of its episodes the rubric scored
instead (`FALLBACK_RATIO`) and how many per kind of failure (`FALLBACKS_PREFIX` + kind), and the
harness reports them (`signal.judge_fallback_ratio`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.domains.base import Episode

PROTOCOL = """You judge whether an agent followed the tool protocol of a bug-fixing environment.
The agent writes exactly one action per line, one of: `search NAME`, `read FILE`,
`edit FILE: OLD => NEW`, `test`, `git log`, `git show ID`, `submit`. The environment answers each
action with one line. A good episode: every line is a valid action written exactly, no action is
repeated without need, the agent looks before it edits, tests after editing, and ends with
`submit`. Score instruction following only (not whether the fix is right): 1 = follows the protocol
perfectly, 0 = ignores it."""

#: Step metrics (TRL-style names): the share of the step's episodes that the Claude judge could not
#: score, so the fallback scored them; and one count per kind of failure, `judge/fallbacks/<kind>`.
FALLBACK_RATIO = "judge/fallback_ratio"
FALLBACKS_PREFIX = "judge/fallbacks/"

SCORE_TOOL = {
    "name": "score",
    "description": "Report how well the episode follows the protocol.",
    "input_schema": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "reason": {"type": "string", "description": "One short sentence."},
        },
        "required": ["score", "reason"],
    },
}


@dataclass(frozen=True)
class JudgeTally:
    """What a judge did since the last tally: episodes it scored (by Claude, from its cache, or by
    the fallback), and those the fallback scored, by kind of failure."""

    scored: int
    fallbacks: dict[str, int]

    def metrics(self) -> dict[str, float]:
        """The step metrics (`FALLBACK_RATIO`, `FALLBACKS_PREFIX` + kind); none when nothing was scored."""
        if not self.scored:
            return {}
        kinds = {FALLBACKS_PREFIX + kind: float(n) for kind, n in sorted(self.fallbacks.items())}
        return {FALLBACK_RATIO: sum(self.fallbacks.values()) / self.scored, **kinds}


class ClaudeJudge:
    """`judge(episode) -> float`: Claude's protocol score, or `fallback(episode)` when it cannot."""

    def __init__(
        self,
        fallback: Callable[[Episode], float],
        model: str = "claude-sonnet-4-5",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        cache_size: int = 4096,
        timeout: float = 30.0,
    ) -> None:
        self.fallback = fallback
        self.model = model
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        self._client: Any = None
        if key:
            import anthropic

            self._client = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=2, timeout=timeout)
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        #: Episodes scored by Claude, and by the fallback (with the kind of failure).
        self.judged = 0
        self.fallbacks: dict[str, int] = {}
        # Since the last `take_tally`: episodes scored in any way (cache hits too), and fallbacks.
        self._scored = 0
        self._fell_back: dict[str, int] = {}

    @property
    def available(self) -> bool:
        return self._client is not None

    def take_tally(self) -> JudgeTally:
        """What this judge did since the previous call (a training step logs it per batch)."""
        with self._lock:
            tally = JudgeTally(self._scored, self._fell_back)
            self._scored, self._fell_back = 0, {}
        return tally

    def __call__(self, episode: Episode) -> float:
        with self._lock:
            self._scored += 1
        if self._client is None:
            return self._fall_back(episode, "no key")
        transcript = episode.task.prompt + episode.transcript()
        digest = hashlib.sha256(transcript.encode()).hexdigest()
        with self._lock:
            if digest in self._cache:
                self._cache.move_to_end(digest)
                return self._cache[digest]
        try:
            score = self._ask(transcript)
        except Exception as exc:  # noqa: BLE001 - any failure scores by the rubric instead
            return self._fall_back(episode, type(exc).__name__)
        with self._lock:
            self.judged += 1
            self._cache[digest] = score
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return score

    def _ask(self, transcript: str) -> float:
        reply = self._client.messages.create(
            model=self.model,
            max_tokens=200,
            system=PROTOCOL,
            tools=[SCORE_TOOL],
            tool_choice={"type": "tool", "name": "score"},
            messages=[{"role": "user", "content": f"<episode>\n{transcript}\n</episode>"}],
        )
        for block in reply.content:
            if getattr(block, "type", None) == "tool_use" and block.name == "score":
                value = float(block.input["score"])
                if not 0.0 <= value <= 1.0:
                    raise ValueError("score outside [0, 1]")
                return value
        raise ValueError("no score in the reply")

    def _fall_back(self, episode: Episode, why: str) -> float:
        with self._lock:
            self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
            self._fell_back[why] = self._fell_back.get(why, 0) + 1
        return self.fallback(episode)
