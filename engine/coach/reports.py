"""What a gate's report says, in lines: one reading for the terminal and the workbench.

A gate stores its report as JSON (`Gates.open`); the CLI prints it and the workbench shows it in
its gates panel. This module imports nothing of the engine, so the workbench's widgets may use it.
"""

from __future__ import annotations

from typing import Any


def gate_report_lines(report: Any, detail: bool = True) -> list[str]:
    """A gate's report, briefly: a design's proposals (with their hypotheses when `detail`), the
    backtests, a verdict and the decision proposed (with its reason and what the investigation
    of an unexplained verdict found), or a diagnosis's rules."""
    if isinstance(report, dict) and "proposals" in report:
        lines = [f"rationale: {report.get('rationale', '')}"] if detail else []
        for p in report["proposals"]:
            lines.append(f"- {p['title']}")
            if detail:
                lines.append(f"  hypothesis: {p['intervention']['hypothesis']}")
        if detail and report.get("ranking"):
            lines += ranking_lines(report["ranking"])
        return lines or ["(no proposals)"]
    if isinstance(report, list):
        return [f"- {r['title']}: {r['backtest']['summary']}" for r in report]
    if isinstance(report, dict) and "verdict" in report:
        lines = [f"verdict: {report['verdict']}"]
        investigation = report.get("investigation")
        if investigation:
            moved = ", ".join(m["metric"] for m in investigation["anomaly"].get("moved", [])[:3])
            head = "unexplained: no rule fired" if investigation["anomaly"].get("unexplained", True) else "every gain"
            lines.append(f"{head}{f'; moved most: {moved}' if moved else ''}")
            found = [p for p in investigation["probes"] if p["found"]]
            lines += [f"found: {p['summary']}" for p in found] or [f"investigated: {investigation['summary']}"]
        if report.get("flips"):
            lines += flip_lines(report["flips"], examples=3 if detail else 0)
        proposed = f"proposed: {report['decision']}"
        return [*lines, f"{proposed} ({report['reason']})" if detail else proposed]
    if isinstance(report, dict) and report.get("decision") == "held":
        return [f"held for a person: {report['reason']}"]
    if isinstance(report, dict) and "rules" in report:
        rules = report["rules"]
        return [f"rule {r['rule']} ({r['severity']}): {r['explanation']}" for r in rules] or ["no rule fired"]
    return []


def ranking_lines(ranking: list[dict[str, Any]], top: int = 8) -> list[str]:
    """The round's Thompson ranking (`engine.coach.bandit`): what each template won and lost against
    its control in this workspace, its prior, posterior mean and this round's draw."""
    lines = ["ranking (won/lost against the control; prior; mean; this round's draw):"]
    for a in ranking[:top]:
        prior = f"{a['prior'][0]},{a['prior'][1]}"
        lines.append(
            f"  {a['template']:<22} {a['won']}/{a['lost']}  prior {prior:<4} mean {a['mean']:.2f}  draw {a['draw']:.2f}"
        )
    return lines


def flip_lines(flips: dict[str, Any], examples: int = 3) -> list[str]:
    """The val tasks whose outcome flipped between parent and child (`engine.verdict.flips`): the
    counts each way, and a few of each with both versions' answers side by side."""
    lines = [
        f"flips ({flips['decoding']}): {flips['to_right']} wrong -> right, {flips['to_wrong']} right -> wrong "
        f"of {flips['tasks']} tasks"
    ]
    for direction, label in (("to_right", "wrong -> right"), ("to_wrong", "right -> wrong")):
        for f in [f for f in flips["examples"] if f["direction"] == direction][:examples]:
            reference = f" (reference {f['reference']})" if f.get("reference") else ""
            lines.append(f"  {label}: {_flat(f['prompt'])}: {_flat(f['parent'])!r} -> {_flat(f['child'])!r}{reference}")
    return lines


def _flat(text: str, limit: int = 48) -> str:
    flat = text.strip().replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
