"""The headless command line: `evotui init | run | status | versions | gates | approve | revise | abort | ...`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from engine.api import queries
from engine.api.client import EngineClient, EngineError, EngineUnavailable
from engine.coach.gates import Answer, Gate, GateError, nobody
from engine.coach.gates import auto_approve as auto_approve_gate
from engine.coach.loop import Coach, CoachEvent
from engine.coach.reports import gate_report_lines
from engine.config import WorkspaceConfigError
from engine.core import Engine, RunFailed, RunUpdate
from engine.daemon import EngineRunningError, serve, socket_path, spawn
from engine.domains.dataset import DatasetError
from engine.export import ExportError, export_metrics, export_rollouts
from engine.harness.diagnose import headline
from engine.store import Store, StoreLockedError
from engine.versions import VersionTreeError
from engine.workspace import TEMPLATES, Workspace, WorkspaceError, init_workspace
from evotui.access import engine_socket, open_access

app = typer.Typer(
    name="evotui",
    help="An autonomous trainer for RL post-training of language-model policies (GRPO on TRL).\n\n"
    "Without a command, in a workspace directory: opens the workbench (`evotui tui .`).",
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True)

WorkspaceArg = Annotated[Path, typer.Argument(help="The workspace directory.", show_default=False)]
USER_ERRORS = (WorkspaceConfigError, WorkspaceError, StoreLockedError, VersionTreeError, RunFailed, DatasetError)


def _fail(exc: Exception) -> None:
    err.print(f"[bold red]error:[/] {exc}", highlight=False)
    raise typer.Exit(1)


@app.callback()
def _default(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        if (Path.cwd() / "workspace.toml").is_file():
            tui(Path.cwd())
        else:
            console.print(ctx.get_help())


@app.command()
def tui(
    workspace: Annotated[Path, typer.Argument(help="The workspace directory.")] = Path("."),
    no_engine: Annotated[bool, typer.Option("--no-engine", help="Do not start an engine; wait for one.")] = False,
) -> None:
    """The workbench: version tree, live curves, diagnosis, gates, rollouts, memory (also over SSH).

    Starts the workspace's engine if none runs; closing the workbench leaves it running."""
    try:
        root = Workspace.open(workspace).root
    except USER_ERRORS as exc:
        _fail(exc)
    from evotui.tui.app import EvoApp

    EvoApp(root, start_engine=not no_engine).run()


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="New (or empty) directory for the workspace.")],
    template: Annotated[str, typer.Option("--from", help=f"Template: {', '.join(TEMPLATES)}.")] = "sample",
) -> None:
    """Create a workspace from a template; it becomes its own git repository."""
    try:
        ws = init_workspace(directory, template)
    except USER_ERRORS as exc:
        _fail(exc)
    console.print(f"Created workspace [bold]{ws.root}[/] from template '{template}'.")
    console.print(f"Next: [bold]evotui run {ws.root} --auto-approve --versions 1[/]")


class _RunDisplay:
    """A progress bar per run, with the live reward (or warm-up loss) beside it."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, update: RunUpdate) -> None:
        if update.run_id not in self.tasks:
            label = "warm-up v0" if update.kind == "warmup" else f"GRPO {update.version}"
            self.tasks[update.run_id] = self.progress.add_task(label, total=update.total_steps or None, live="")
        task = self.tasks[update.run_id]
        m = update.metrics
        if "reward" in m:
            live = f"reward {m['reward']:.3f}  dead groups {m.get('frac_reward_zero_std', float('nan')):.2f}"
        elif "warmup/loss" in m:
            live = f"loss {m['warmup/loss']:.3f}"
        else:
            live = ""
        if "eval/greedy_accuracy" in m:
            live += f"  val {m['eval/greedy_accuracy']:.3f}"
        if update.state == "failed":
            live = "[red]failed[/]"
        total = update.total_steps or None
        completed = update.total_steps if update.state == "succeeded" and total else update.step
        self.progress.update(task, total=total, completed=completed, live=live)


def _terminal_answer(gate: Gate) -> Answer | None:
    """Ask at the terminal: approve, revise (with feedback) or abort."""
    forced = ", forced: a person must answer it" if gate.forced else ""
    return _terminal_answer_for(gate.id, gate.kind + forced, gate.question)


def _terminal_answer_for(gate_id: str, kind: str, question: str) -> Answer:
    console.print(f"[bold]gate {gate_id}[/] ({kind})")
    verb = typer.prompt(f"{question} [approve/revise/abort]", default="approve").strip().lower()
    while verb not in ("approve", "revise", "abort", "a", "r", "x"):
        verb = typer.prompt("answer approve, revise or abort", default="approve").strip().lower()
    verb = {"a": "approve", "r": "revise", "x": "abort"}.get(verb, verb)
    feedback = typer.prompt("what should the next proposal do differently?") if verb == "revise" else ""
    return Answer(verb, feedback, by="terminal")  # type: ignore[arg-type]


def _event_line(event: CoachEvent) -> str | None:
    style = {
        "round": "bold",
        "decision": "bold",
        "verdict": "",
        "diagnosis": "",
        "proposal": "cyan",
        "refused": "yellow",
        "fallback": "yellow",
        "escalation": "magenta",
        "evolution": "magenta",
        "waiting": "yellow",
    }.get(event.kind, "dim")
    text = escape(event.message)
    # A run's diagnosis comes with its headline, one line each.
    text += "".join(f"\n  {escape(line)}" for line in event.data.get("lines", ()))
    return f"[{style}]{text}[/]" if style else text


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _versions_table(versions: list[dict[str, Any]], names: list[str]) -> Table:
    """`versions` as `list_versions` gives them (locally or from the engine)."""
    table = Table(
        title="Versions: correctness on the held-out split", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in ("version", "parent", "state", "verdict"):
        table.add_column(col, no_wrap=True)
    for col in ("greedy", "sampled", "Δ ± floor"):
        table.add_column(col, justify="right", no_wrap=True)
    for v in versions:
        if v["name"] in names:
            delta = "—" if v["verdict_delta"] is None else f"{v['verdict_delta']:+.3f} ±{v['verdict_floor']:.3f}"
            verdict = (v["verdict"] or "—").replace("insufficient evidence", "insufficient")  # 80 columns
            table.add_row(
                v["name"], v["parent"] or "—", v["state"], verdict, _fmt(v["val_greedy"]), _fmt(v["val_sampled"]), delta
            )
    table.caption = "Δ ± floor: the verdict's primary comparison with its parent, and its 95% half-width"
    return table


def _training_table(engine: Engine, names: list[str]) -> Table | None:
    table = Table(title="GRPO runs", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("run", no_wrap=True)
    for col in ("steps", "reward", "dead groups", "truncated"):
        table.add_column(col, justify="right", no_wrap=True)
    window = 10
    for name in names:
        if (run := engine.train_run(name)) is None:
            continue
        curves = engine.train_curve_summary(run.id, window)
        cells = []
        for key, digits in (("reward", 3), ("frac_reward_zero_std", 2), ("completions/clipped_ratio", 2)):
            first, last = curves.get(key, (None, None))
            cells.append(f"{_fmt(first, digits)} → {_fmt(last, digits)}")
        table.add_row(run.id, str(run.total_steps), *cells)
    table.caption = f"first → last: mean over the first and the last {window} steps"
    return table if table.row_count else None


@app.command()
def run(
    workspace: WorkspaceArg,
    versions: Annotated[int, typer.Option(min=1, help="How many versions to train.")] = 1,
    auto_approve: Annotated[
        bool,
        typer.Option(
            "--auto-approve",
            help="Approve every gate, except forced ones (after consecutive failures; a version held because "
            "judging it failed).",
        ),
    ] = False,
    harness: Annotated[
        str | None, typer.Option(help="full, or score-only (the ablation); default: [coach] harness.")
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="A budget of GRPO steps: screen short, continue the winner longer (up to --versions versions).",
        ),
    ] = None,
) -> None:
    """Run the coach: diagnose, propose, backtest, train and judge VERSIONS versions, and decide.

    Gates ask at the terminal. Without one (and without --auto-approve), the loop stops at the
    first gate; answer it with `evotui approve|revise|abort WS GATE_ID` and run again to resume.
    """
    if harness is not None and harness not in ("full", "score-only"):
        _fail(ValueError(f"--harness must be full or score-only, not {harness!r}"))
    try:
        if (path := engine_socket(workspace)) is not None:
            _run_remote(path, versions, auto_approve, harness, steps)
            return
        with Engine.open(workspace) as engine:
            console.print(f"Workspace [bold]{engine.workspace.root}[/] ({engine.config.workspace.name})")
            progress = _progress()

            def on_event(event: CoachEvent) -> None:
                if (line := _event_line(event)) is not None:
                    progress.console.print(line, highlight=False)

            if auto_approve:
                answer = auto_approve_gate
            elif sys.stdin.isatty():
                answer = _terminal_answer
            else:
                answer = nobody
            coach = Coach(engine, answer=answer, on_event=on_event, harness=harness)
            start = {v.name for v in engine.store.list_versions()}
            with progress:
                result = coach.run(versions, _RunDisplay(progress), steps=steps)
            shown = ["v0", *result.trained] if "v0" not in start or result.trained else ["v0"]
            console.print(_versions_table(queries.versions(engine.store), shown))
            if (training := _training_table(engine, shown)) is not None:
                console.print(training)
            if result.waiting is not None:
                g = result.waiting
                why = " (forced: --auto-approve does not answer it)" if g.forced else ""
                console.print(
                    f"[yellow]gate {g.id} waits{why}:[/] {escape(g.question)}\n"
                    f"  evotui gates {engine.workspace.root}   (its report)\n"
                    f"  evotui approve|abort {engine.workspace.root} {g.id}, or "
                    f"evotui revise {engine.workspace.root} {g.id} 'feedback'; then run again",
                    highlight=False,
                )
            elif result.stopped:
                console.print(f"[yellow]stopped:[/] {escape(result.stopped)}", highlight=False)
    except USER_ERRORS as exc:
        _fail(exc)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: the run was stopped at its last checkpoint; `evotui run` resumes it")
        raise typer.Exit(130) from None


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[live]}"),
        console=console,
    )


def _run_remote(path: Path, versions: int, auto_approve: bool, harness: str | None, steps: int | None) -> None:
    """`run` when an engine serves the workspace: it runs the coach; this follows its events and
    answers its gates at the terminal. Leaving (Ctrl-C, or a gate without a terminal) leaves the
    engine going."""
    try:
        with EngineClient(path, timeout=None) as client:
            hello = client.call("hello")
            console.print(f"Workspace [bold]{hello['workspace']}[/] ({hello['name']}), engine pid {hello['pid']}")
            client.call("subscribe")
            client.call("start", versions=versions, auto_approve=auto_approve, harness=harness, steps=steps)
            progress = _progress()
            display = _RunDisplay(progress)
            with progress:
                for event in client.events():
                    d = event.data
                    if event.event == "coach":
                        line = _event_line(CoachEvent(d["kind"], d["message"], d))
                        if line:
                            progress.console.print(line, highlight=False)
                    elif event.event == "run":
                        display(RunUpdate(**d))
                    elif event.event == "gate":
                        if auto_approve or not sys.stdin.isatty():
                            progress.console.print(
                                f"[yellow]gate {d['gate']} waits in the engine:[/] {escape(d['question'])}\n"
                                f"  evotui gates|approve|revise|abort {hello['workspace']} {d['gate']}",
                                highlight=False,
                            )
                            return
                        progress.stop()
                        answer = _terminal_answer_for(d["gate"], d["kind"], d["question"])
                        client.call("answer_gate", gate=d["gate"], verb=answer.verb, feedback=answer.feedback)
                        progress.start()
                    elif event.event == "coach_state" and not d.get("running"):
                        if d.get("error"):
                            err.print(f"[red]the coach failed:[/] {escape(d['error'])}")
                        elif d.get("stopped"):
                            progress.console.print(f"[yellow]stopped:[/] {escape(d['stopped'])}", highlight=False)
                        break
            rows = client.call("list_versions")
            console.print(_versions_table(rows, [v["name"] for v in rows]))
    except EngineError as exc:
        _fail(exc)
    except EngineUnavailable as exc:
        _engine_lost(path, exc)
    except KeyboardInterrupt:
        err.print("[yellow]left[/]: the engine goes on; `evotui status` shows where it is")
        raise typer.Exit(130) from None


def _engine_lost(path: Path, exc: EngineUnavailable) -> None:
    """A client whose engine went away: one line, and how to go on; never a traceback."""
    root = path.parent.parent  # <workspace>/.evotrainer/engine.sock
    err.print(
        f"[bold red]error:[/] the engine of {root} went away ({exc}); "
        f"`evotui status {root}` shows where its versions are, `evotui run {root}` goes on from there",
        highlight=False,
        soft_wrap=True,  # one line, whatever the terminal's width
    )
    raise typer.Exit(1)


def _answer_gate(workspace: Path, gate_id: str, verb: str, feedback: str = "") -> None:
    try:
        with open_access(workspace) as access:
            done = access.call("answer_gate", gate=gate_id, verb=verb, feedback=feedback)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if done["taken_by"] == "coach":
        console.print(f"gate {gate_id}: {verb} taken by the running engine; it goes on.")
    else:
        console.print(f"gate {gate_id}: {done['state']}. `evotui run {workspace}` goes on from there.")


GateArg = Annotated[str, typer.Argument(help="The gate id, e.g. g3 (see `evotui gates WS`).", show_default=False)]


@app.command()
def approve(workspace: WorkspaceArg, gate: GateArg) -> None:
    """Approve a pending gate."""
    _answer_gate(workspace, gate, "approve")


@app.command()
def revise(
    workspace: WorkspaceArg,
    gate: GateArg,
    feedback: Annotated[str, typer.Argument(help="What the next proposal should do differently.")],
) -> None:
    """Answer a pending gate with revise: the feedback goes into the next proposal."""
    try:
        Answer("revise", feedback, by="cli")  # checks the feedback before anything is opened
    except GateError as exc:
        _fail(exc)
    _answer_gate(workspace, gate, "revise", feedback)


@app.command()
def abort(workspace: WorkspaceArg, gate: GateArg) -> None:
    """Abort at a pending gate: the loop stops and what the round had not run is pruned."""
    _answer_gate(workspace, gate, "abort")


@app.command()
def gates(
    workspace: WorkspaceArg,
    all_gates: Annotated[bool, typer.Option("--all", help="Answered gates too.")] = False,
) -> None:
    """Gates waiting for an answer, with their reports."""
    try:
        with open_access(workspace) as access:
            shown = [g for g in access.call("gates") if all_gates or g["state"] == "pending"]
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if not shown:
        console.print("no gate is pending" if not all_gates else "no gates yet")
    for g in shown:
        forced = " [yellow]forced[/]" if g["forced"] else ""
        console.print(f"[bold]{g['id']}[/] {g['kind']} {g['subject']}: {g['state']}{forced}", highlight=False)
        console.print(f"  {escape(g['question'])}", highlight=False)
        for line in gate_report_lines(g["report"].get("report")):
            console.print(f"  {escape(line)}", highlight=False)
        if g["feedback"]:
            console.print(f"  feedback: {escape(g['feedback'])}", highlight=False)


@app.command("engine")
def engine_cmd(
    workspace: WorkspaceArg,
    detach: Annotated[bool, typer.Option("--detach", help="Start it in the background and return.")] = False,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the engine serving WORKSPACE.")] = False,
) -> None:
    """The workspace's engine: it owns the store, runs the coach and the runs, and serves the
    socket the TUI and the CLI talk to. Foreground by default (Ctrl-C stops it)."""
    try:
        root = Workspace.open(workspace).root
        path = engine_socket(root)
        if stop:
            if path is None:
                console.print("no engine serves this workspace")
                return
            with EngineClient(path) as client:
                pid = client.call("hello")["pid"]
            os.kill(pid, signal.SIGTERM)
            for _ in range(300):
                if engine_socket(root) is None:
                    break
                time.sleep(0.1)
            console.print(f"engine (pid {pid}) stopped")
            return
        if path is not None:
            with EngineClient(path) as client:
                console.print(f"an engine (pid {client.call('hello')['pid']}) already serves {root}")
            return
        if detach:
            console.print(f"engine started (pid {spawn(root)}); socket {socket_path(root)}")
            return
        console.print(f"engine serving {socket_path(root)} (pid {os.getpid()}); Ctrl-C stops it")
        asyncio.run(serve(root))
    except (*USER_ERRORS, EngineError, EngineRunningError, RuntimeError) as exc:
        _fail(exc)


def _seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r}: expected seeds like 0,1,2") from None


@app.command()
def bench(
    workspace: WorkspaceArg,
    quick: Annotated[bool, typer.Option("--quick", help="The CI-sized run: one seed, a few steps per arm.")] = False,
    budget: Annotated[
        int | None, typer.Option(min=1, help="GRPO steps per arm (default: [bench] budget_steps).")
    ] = None,
    seeds: Annotated[str | None, typer.Option(help="Comma-separated seeds (default: [bench] seeds).")] = None,
    lanes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Jobs side by side, each run with cores // lanes torch threads (default: [bench] lanes, else one"
            " per core up to 4; 1: one after the other).",
        ),
    ] = None,
) -> None:
    """The autonomy benchmark: base, hand recipe, score-only loop and full loop on the same v0,
    data and step budget, scored on the clean environment. Writes a Markdown report with a
    plot per arm, prints it here, and stores the results in the workspace's store."""
    from engine.bench.arms import BenchError, BenchSettings, run_bench
    from engine.bench.report import main_table, store_results, write_report
    from engine.store import Store

    try:
        ws = Workspace.open(workspace)
        if engine_socket(ws.root) is not None:
            raise BenchError(f"an engine serves {ws.root}; stop it first (`evotui engine {ws.root} --stop`)")
        config = ws.load_config()
        settings = BenchSettings.from_config(config, quick=quick, budget=budget, seeds=_seeds(seeds), lanes=lanes)
        run = run_bench(ws.root, settings, say=lambda line: console.print(line, highlight=False))
        path, found, plots = write_report(run, config.domain.name)
        with Store(ws.db_path) as store:
            store_results(store, run, found, path.read_text(encoding="utf-8"))
    except (*USER_ERRORS, BenchError) as exc:
        _fail(exc)
    head, *rows = main_table(run.results)
    table = Table(*head, title=f"{run.bench_id}: clean held-out scores", box=box.SIMPLE_HEAD)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for f in found:
        console.print(f"[bold]{f.title}[/]: {f.verdict()}", highlight=False)
    for plot in plots.values():
        console.print(Text.from_ansi(plot))
    console.print(f"report: {path}")


@app.command()
def status(workspace: WorkspaceArg) -> None:
    """The workspace at a glance: the engine, versions, the best one, recent runs, pending gates."""
    try:
        with open_access(workspace) as access:
            hello = access.call("hello")
            state = access.call("status")
            versions = access.call("list_versions")
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    console.print(f"[bold]{hello['name']}[/]  {hello['workspace']}")
    if access.remote:
        coach = "the coach is running" if state["coach_running"] else "the coach is idle"
        console.print(f"engine: pid {hello['pid']}, {coach}")
    else:
        console.print("engine: none running (`evotui engine WS` starts one)")
    best = next((v for v in versions if v["name"] == state["best"]), None)
    console.print(
        f"{len(versions)} version(s); best: "
        + (f"{best['name']} (val greedy {_fmt(best['val_greedy'])})" if best else "none yet")
    )
    runs = state["runs"]
    if runs:
        table = Table(title="Recent runs", title_justify="left")
        for col in ("run", "version", "kind", "state", "steps", "ended"):
            table.add_column(col)
        for r in runs:
            table.add_row(
                r["id"], r["version"], r["kind"], r["state"], str(r["total_steps"] or "—"), (r["ended_at"] or "—")[:16]
            )
        console.print(table)
        failed = [r for r in runs if r["state"] == "failed"]
        if failed:
            last = (failed[-1]["error_tail"] or "").strip()
            console.print(f"[red]last failure ({failed[-1]['id']}):[/] " + (last.splitlines()[-1] if last else ""))
        for r in runs:
            if r["state"] == "interrupted":
                console.print(f"[yellow]{r['id']} was interrupted[/]: `evotui run {workspace}` resumes it")
    for gate_id in state["pending_gates"]:
        console.print(f"[yellow]gate {gate_id} waits[/]  → evotui gates {workspace}")


def _version_label(v: dict[str, Any]) -> str:
    color = {"promoted": "green", "rejected": "red", "failed": "red", "training": "yellow", "pruned": "dim"}.get(
        v["state"], "white"
    )
    scores = (
        f"greedy {_fmt(v['val_greedy'])} sampled {_fmt(v['val_sampled'])}"
        if v["val_greedy"] is not None
        else "no score"
    )
    verdict = f" · {v['verdict']}" if v["verdict"] else ""
    return f"[bold]{v['name']}[/] [{color}]{v['state']}[/] · {scores}{verdict}"


@app.command("versions")
def versions_cmd(workspace: WorkspaceArg) -> None:
    """The version tree, with scores, states and each version's change."""
    try:
        with open_access(workspace) as access:
            records = access.call("list_versions")
            name = access.call("hello")["name"]
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if not records:
        console.print("No versions yet: `evotui run WS` builds v0.")
        return
    children: dict[str | None, list[dict[str, Any]]] = {}
    for v in records:
        children.setdefault(v["parent"], []).append(v)

    def add(node: Tree, v: dict[str, Any]) -> None:
        label = _version_label(v)
        if v["change"] is not None:
            change = ", ".join(f"{k}: {c['from']} → {c['to']}" for k, c in json.loads(v["change"]).items())
            label += f"\n[dim]Δ {escape(change) or 'GRPO with the parent recipe'}[/]"
        if v["decision_reason"] and v["parent"] is not None:
            label += f"\n[dim]why: {escape(v['decision_reason'])}[/]"
        child = node.add(label)
        for c in children.get(v["name"], []):
            add(child, c)

    root = Tree(f"[bold]{name}[/]", guide_style="dim")
    for v in children.get(None, []):
        add(root, v)
    console.print(root)


def main() -> None:
    try:
        app()
    except EngineUnavailable as exc:  # any command whose engine died mid-call
        err.print(f"[bold red]error:[/] {exc}; `evotui status DIR` shows where it is", highlight=False)
        sys.exit(1)


def _print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


VersionArg = Annotated[str, typer.Argument(help="A version, e.g. v1.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for programs instead of text.")]


@app.command("diagnose")
def diagnose_cmd(workspace: WorkspaceArg, version: VersionArg, as_json: JsonOpt = False) -> None:
    """Diagnose a version's latest run again with the workspace's current harness."""
    try:
        with open_access(workspace) as access:
            diagnosis = access.call("diagnose", version=version)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(diagnosis)
        return
    console.print(f"[bold]{diagnosis['run_id']}[/] · harness {diagnosis['harness_revision']}", highlight=False)
    for line in headline(diagnosis, limit=50):
        console.print(f"  {line}", highlight=False)
    if "flagged" in diagnosis:
        console.print(_flagged_line(diagnosis["flagged"]), highlight=False)


def _flagged_line(flag: dict[str, Any]) -> str:
    cards = ", ".join(flag["cards"]) or "none"
    case = "its case retracted" if flag["case"] else "no case on record"
    return f"{flag['version']} ({flag['state']}) flagged: {flag['reason']}. Skill cards retracted: {cards}; {case}"


@app.command("flag")
def flag_cmd(
    workspace: WorkspaceArg,
    version: VersionArg,
    reason: Annotated[str, typer.Option("--reason", help="What is wrong with the version, in words.")],
    as_json: JsonOpt = False,
) -> None:
    """Flag a version found wanting after its decision (a hack seen in its rollouts, a test-split
    loss): the skill cards and the case it wrote are retracted, kept and marked, never retrieved."""
    try:
        with open_access(workspace) as access:
            flag = access.call("flag", version=version, reason=reason)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(flag)
        return
    console.print(_flagged_line(flag), highlight=False)


@app.command("eval")
def eval_cmd(
    workspace: WorkspaceArg,
    version: VersionArg,
    split: Annotated[
        str, typer.Option(help="test (held out from every decision) or val (what the loop decides on).")
    ] = "test",
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a version on a split, greedy and sampled, with the sampled score's 95% half-width.

    Test is the split nothing in the loop reads: its score carries no winner's curse. The run is
    stored like any (an eval run), and the rollout browser shows its rollouts."""
    if split not in ("val", "test"):
        _fail(ValueError(f"--split must be val or test, not {split!r}"))
    try:
        if engine_socket(workspace) is not None:
            raise RuntimeError(f"an engine serves {workspace}; stop it first (`evotui engine {workspace} --stop`)")
        with Engine.open(workspace) as engine:
            progress = _progress()
            with progress:
                run, scores = engine.evaluate(version, split, _RunDisplay(progress))  # type: ignore[arg-type]
    except (*USER_ERRORS, ValueError, RuntimeError) as exc:
        _fail(exc)
    if as_json:
        _print_json({"run_id": run.id, **asdict(scores)})
        return
    console.print(f"{version} on {scores.summary()} ({run.id})", highlight=False)


@app.command()
def report(
    workspace: Annotated[Path | None, typer.Argument(help="The workspace directory.", show_default=False)] = None,
    version: Annotated[str | None, typer.Argument(help="A version, e.g. v1.", show_default=False)] = None,
    against: Annotated[str | None, typer.Option(help="Compare with this version (default: the parent).")] = None,
    thresholds: Annotated[
        bool,
        typer.Option("--thresholds", help="Print the harness's table of thresholds instead (no WORKSPACE or VERSION)."),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The health report of a version: diagnosis, trends, reward flow, rollouts to read.

    With --thresholds: every line the built-in harness grades findings and fires rules on, with
    the principle it rests on and the analyzers and rules that read it."""
    if thresholds:
        if workspace is not None or version is not None or against is not None:
            _fail(ValueError("--thresholds prints the built-in table: give no WORKSPACE, VERSION or --against"))
        _print_thresholds(as_json)
        return
    if workspace is None or version is None:
        _fail(ValueError("report needs WORKSPACE and VERSION (e.g. `evotui report . v1`), or --thresholds"))
    from engine.harness.health import render_markdown

    try:
        with open_access(workspace) as access:
            data = access.call("report", version=version, against=against)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(data)
    else:
        sys.stdout.write(render_markdown(data))


def _print_thresholds(as_json: bool) -> None:
    """The table, an entry a paragraph (it reads at 80 columns): the line, its metric, its basis and
    principle, and who reads it."""
    from engine.harness.thresholds import THRESHOLDS, Threshold

    if as_json:
        _print_json([t.to_dict() for t in THRESHOLDS])
        return
    console.print("[bold]Harness thresholds[/] (engine/harness/thresholds.py)\n", highlight=False)

    def where(t: Threshold) -> str:
        return "" if t.defined_in == "engine.harness.thresholds" else f" Defined in {t.defined_in}."

    for t in THRESHOLDS:
        metric = f"  {t.metric}" if t.metric else ""
        console.print(f"[bold]{t.name}[/]  {escape(t.line)}[dim]{escape(metric)}[/]", highlight=False)
        console.print(Padding(Text(f"{t.basis}: {t.principle}{where(t)}"), (0, 0, 0, 2)))
        console.print(Padding(Text(f"read by {', '.join(t.readers)}", style="dim"), (0, 0, 0, 2)))


@app.command("export")
def export_cmd(
    workspace: WorkspaceArg,
    rollouts: Annotated[Path | None, typer.Option(help="Write the rollouts to this Parquet file.")] = None,
    metrics: Annotated[
        Path | None, typer.Option(help="Write the metrics (run, step, key, value) to this Parquet file.")
    ] = None,
    version: Annotated[str | None, typer.Option(help="Only the runs of this version (default: every one).")] = None,
    split: Annotated[
        str | None, typer.Option(help="Only rollouts of this split: train, val, test, clean (default: every one).")
    ] = None,
) -> None:
    """Write rollouts and/or metrics to Parquet files, each row with its run's version and kind.

    It reads the store itself, which only one process may open: with an engine serving the
    workspace, stop it first (`evotui engine WS --stop`)."""
    if rollouts is None and metrics is None:
        _fail(ValueError("nothing to export: give --rollouts FILE, --metrics FILE, or both"))
    if split is not None and rollouts is None:
        _fail(ValueError("--split filters rollouts (metrics have no split): give --rollouts FILE too"))
    if rollouts is not None and metrics is not None and rollouts.resolve() == metrics.resolve():
        _fail(ValueError(f"--rollouts and --metrics name the same file, {rollouts}"))
    try:
        ws = Workspace.open(workspace)
        if engine_socket(ws.root) is not None:
            raise ExportError(f"an engine serves {ws.root}; stop it first (`evotui engine {ws.root} --stop`)")
        with Store(ws.db_path) as store:
            # Rollouts first: they check both filters, so a bad one writes no file at all.
            if rollouts is not None:
                rows = export_rollouts(store, rollouts, version, split)
                console.print(_wrote(rows, "rollout", rollouts, version, split), highlight=False)
            if metrics is not None:
                rows = export_metrics(store, metrics, version)
                console.print(_wrote(rows, "metric row", metrics, version, None), highlight=False)
    except (*USER_ERRORS, ExportError) as exc:
        _fail(exc)


def _wrote(rows: int, noun: str, path: Path, version: str | None, split: str | None) -> str:
    if rows:
        return f"Wrote {rows:,} {noun}{'s' if rows != 1 else ''} to {escape(str(path))}"
    scope = "".join((f" of {version}" if version else "", f" on {split}" if split else "")) or " in the store"
    return f"Wrote 0 rows to {escape(str(path))}: no {noun}s{escape(scope)}"


backtest_app = typer.Typer(
    help="Price an intervention on saved rollouts before paying for a run.", no_args_is_help=True
)
app.add_typer(backtest_app, name="backtest")


def _weights(text: str) -> dict[str, float]:
    try:
        pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
        return {k.strip(): float(v) for k, v in pairs}
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected NAME=WEIGHT[,NAME=WEIGHT...], e.g. correctness=1,closeness=0.5"
        ) from None


@backtest_app.command("reward")
def backtest_reward(
    workspace: WorkspaceArg,
    version: VersionArg,
    weights: Annotated[str, typer.Option(help="Candidate reward: NAME=WEIGHT,... over the domain's components.")],
    as_json: JsonOpt = False,
) -> None:
    """Re-score a version's train rollouts under another reward composition."""
    parsed = _weights(weights)
    try:
        with open_access(workspace) as access:
            out = access.call("backtest", kind="reward", version=version, weights=parsed)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(out)
        return
    backtest_id, result = out["id"], SimpleNamespace(**out)
    console.print(f"reward backtest {backtest_id} on {result.run_id}: {parsed}", highlight=False)
    console.print(f"  dead groups {result.dead_before:.1%} -> {result.dead_after:.1%} of {result.groups}")
    console.print(f"  dead groups that regain variance: {result.revived:.1%}")
    rho = result.rank_corr_with_correctness
    console.print(f"  rank correlation with binary correctness: {'—' if rho is None else f'{rho:.3f}'}")
    console.print(f"  mean reward shift: {result.mean_shift:+.3f}")
    if result.rescored_components:
        console.print(f"  re-scored by the verifier: {', '.join(result.rescored_components)}")


@backtest_app.command("filter")
def backtest_filter(
    workspace: WorkspaceArg,
    version: VersionArg,
    std_threshold: Annotated[
        float | None,
        typer.Option(help="Drop groups whose reward std is at or below this (default: [recipe.group_filter]'s)."),
    ] = None,
    keep_ratio: Annotated[float | None, typer.Option(help="Keep at most this share of a step's groups.")] = None,
    ema: Annotated[float | None, typer.Option(help="> 0: the threshold follows an EMA of the median spread.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Which groups the group filter would keep on a version's train rollouts (the settings of
    `[recipe.group_filter]`; unset options take its defaults)."""

    try:
        with open_access(workspace) as access:
            out = access.call(
                "backtest",
                kind="filter",
                version=version,
                std_threshold=std_threshold,
                keep_ratio=keep_ratio,
                ema=ema,
            )
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(out)
        return
    backtest_id, result = out["id"], SimpleNamespace(**out)
    console.print(
        f"filter backtest {backtest_id} on {result.run_id}: std > {result.std_threshold:g}, keep ratio"
        f" {result.keep_ratio:g}, ema {result.ema:g}",
        highlight=False,
    )
    console.print(f"  keeps {result.kept:.1%} of groups; dead among kept {result.dead_after:.1%}")
    console.print(f"  (dead before filtering {result.dead_before:.1%})")


@backtest_app.command("analyzer")
def backtest_analyzer(
    workspace: WorkspaceArg,
    metric: Annotated[str, typer.Argument(help="A finding's metric, e.g. signal.dead_group_ratio.")],
    as_json: JsonOpt = False,
) -> None:
    """Replay the harness over every judged version: does METRIC separate improved from regressed?"""

    try:
        with open_access(workspace) as access:
            out = access.call("backtest", kind="analyzer", metric=metric)
    except (*USER_ERRORS, EngineError) as exc:
        _fail(exc)
    if as_json:
        _print_json(out)
        return
    backtest_id, result = out["id"], SimpleNamespace(**out)
    console.print(f"analyzer validation {backtest_id}: {metric}", highlight=False)
    console.print(f"  improved: {result.improved or '—'}")
    console.print(f"  regressed: {result.regressed or '—'}")
    console.print(f"  {result.summary}")
