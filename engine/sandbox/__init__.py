"""The sandbox in which everything a policy writes runs: Python from a code-generation task, or a
small repository's tests.

    from engine.sandbox import get_sandbox
    result = get_sandbox().run_python("print(sum(range(10)))")
    result.ok, result.stdout, result.reason, result.tier

Each execution is a fresh process forked from a warm, already-sandboxed interpreter (the
"zygote", see `zygote`), in a fresh scratch directory that is its cwd and only writable place,
without network, without the engine's environment or files, under CPU, wall-time, memory,
file-size and process limits. Isolation comes from the strongest tier that works here (see
`tiers`): bubblewrap + seccomp, else Landlock + seccomp; weak isolation (rlimits only) is refused
unless explicitly accepted, and then warned about on every execution.
"""

from engine.sandbox.results import Limits, SandboxResult
from engine.sandbox.sandbox import Sandbox, SandboxUnavailable, get_sandbox

__all__ = ["Limits", "Sandbox", "SandboxResult", "SandboxUnavailable", "get_sandbox"]
