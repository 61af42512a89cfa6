"""The `lanectl` command line: parse, call one domain function, render its result.

Exit codes everywhere: 0 success, 1 the operation failed, 2 bad input or usage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from lanectl import __version__
from lanectl.errors import EXIT_FAILED, LanectlError, RecipeInvalid
from lanectl.project import Project
from lanectl.recipe.catalog import Catalog, load_catalog

if TYPE_CHECKING:
    from lanectl.health.gate import GateProgress
    from lanectl.lanes.switcher import SwitchOutcome

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Run GPU LLM serving lanes safely: recipes to images, switches, rollback, watchdog.")
patches_app = typer.Typer(no_args_is_help=True, help="Backported patches and the upstream source they target.")
app.add_typer(patches_app, name="patches")
watchdog_app = typer.Typer(no_args_is_help=True, help="The health watchdog of the active lane.")
app.add_typer(watchdog_app, name="watchdog")
fleet_app = typer.Typer(no_args_is_help=True, help="Lanes on a fleet of boxes, run by Docker Swarm.")
app.add_typer(fleet_app, name="fleet")

# Engine text (container logs, engine and webhook errors, health details) reaches these consoles:
# it is printed as `Text` or with markup=False, never parsed as rich markup. No emoji codes either:
# "recipes/r.yaml:100:7" would print as "recipes/r.yaml💯7", and `:fire:` in a log line stays `:fire:`.
out = Console(highlight=False, soft_wrap=True, emoji=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

RecipesOption = Annotated[
    Path | None,
    typer.Option("--recipes", help="Recipes folder (default: $LANECTL_RECIPES, else ./recipes).",
                 show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output (a versioned envelope).")]


class _State:
    recipes: Path | None = None


state = _State()


@app.callback()
def _root(recipes: RecipesOption = None,
          version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False) -> None:
    if version:
        out.print(f"lanectl {__version__}")
        raise typer.Exit(0)
    state.recipes = recipes


def emit_json(command: str, data: Any) -> None:
    """The stable envelope scripts parse: bump `lanectl` only on an incompatible change."""
    sys.stdout.write(json.dumps({"lanectl": 1, "command": command, "data": data}, indent=2, sort_keys=True) + "\n")


def catalog(paths: list[Path] | None = None) -> Catalog:
    return load_catalog(Project.locate(state.recipes), paths or [])


@app.command()
def validate(paths: Annotated[list[Path] | None, typer.Argument(help="Recipe files or folders.")] = None,
             as_json: JsonOption = False) -> None:
    """Check every recipe (or those given); exit 2 with every problem listed."""
    from lanectl.commands.validate import validate_recipes

    result = validate_recipes(Project.locate(state.recipes), paths or [])
    if as_json:
        emit_json("validate", result)
    else:
        out.print(f"ok: {len(result['lanes'])} lanes in {len(result['recipes'])} recipes "
                  f"({', '.join(result['lanes'])})")


@app.command()
def lanes(as_json: JsonOption = False) -> None:
    """The lanes of all recipes: name, recipe, image tag, and whether the image is built."""
    from lanectl.commands.lanes import list_lanes

    rows, note = list_lanes(catalog())
    if as_json:
        emit_json("lanes", {"lanes": rows, "note": note})
        return
    header = ("LANE", "RECIPE", "IMAGE", "BUILT", "COMPANIONS")
    table = [header] + [
        (row["lane"], row["recipe"], row["image"], {True: "yes", False: "no", None: "?"}[row["built"]],
         ",".join(row["companions"]) or "-")
        for row in rows
    ]
    # Plain aligned columns: never truncated, whatever the terminal width (tags are long).
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        out.print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(),
                  markup=False)
    if note:
        err.print(note)


@app.command()
def render(lane: Annotated[str, typer.Argument(help="Lane name, e.g. h2-REF.")],
           out_dir: Annotated[Path | None, typer.Option("--out", help="Write the build context here.")] = None,
           as_json: JsonOption = False) -> None:
    """The Dockerfile, build context and container specs of a lane; nothing is built."""
    from lanectl.commands.render import render_lane

    result = render_lane(catalog().lane(lane), out_dir)
    if as_json:
        emit_json("render", result)
        return
    out.print(f"# lane {result['lane']}  image {result['image']}  inputs {result['input_hash']}")
    out.print("# ---- Dockerfile ----")
    out.print(result["dockerfile"], markup=False, end="")
    out.print("# ---- build context ----")
    for item in result["context"]:
        out.print(f"{item['size']:>9}  {item['sha256'][:12]}  {item['path']}", markup=False)
    for tree in result["kernel_sources"]:
        where = f"fetched: {tree['fetched']}" if tree["fetched"] else "not fetched yet: `lanectl build` fetches it"
        out.print(f"{'tree':>9}  {'':12}  {tree['context']}  <- {tree['origin']} ({where})", markup=False)
    out.print("# ---- containers (start order) ----")
    out.print(json.dumps(result["containers"], indent=2), markup=False)
    if result["services"]:
        out.print("# ---- Swarm services (ServiceSpec, one per role and node) ----")
        out.print(json.dumps(result["services"], indent=2), markup=False)
    if out_dir is not None:
        err.print(f"wrote the build context and containers.json to {out_dir}")


@app.command()
def schema() -> None:
    """The JSON Schema of the recipe format, for editors (yaml-language-server)."""
    from lanectl.recipe.schema import recipe_json_schema

    sys.stdout.write(json.dumps(recipe_json_schema(), indent=2) + "\n")


@patches_app.command("check")
def patches_check(as_json: JsonOption = False) -> None:
    """Each patch against the real pinned upstream source: applies | already-upstream | conflicts."""
    from lanectl.commands.patches import check_project_patches

    reports = check_project_patches(Project.locate(state.recipes), progress=err)
    if as_json:
        emit_json("patches.check", {"patches": reports})
    else:
        colours = {"applies": "green", "already-upstream": "yellow", "conflicts": "red"}
        for report in reports:
            first, *rest = report["lines"]
            status, _, remainder = first.partition("  ")
            out.print(f"[{colours[status]}]{status:<17}[/]", end="")
            out.print(f"{remainder}  {report['subject']}", markup=False)
            for line in rest:
                out.print(line, markup=False)
    if any(r["status"] == "conflicts" for r in reports):
        raise typer.Exit(EXIT_FAILED)


@app.command()
def build(lanes_: Annotated[list[str] | None, typer.Argument(metavar="LANE...", help="Lanes to build.")] = None,
          all_lanes: Annotated[bool, typer.Option("--all", help="Build every lane.")] = False,
          push: Annotated[bool, typer.Option("--push", help="Push both tags after building.")] = False,
          no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")] = False,
          as_json: JsonOption = False) -> None:
    """Build lane images (content-addressed tags); unchanged inputs build nothing."""
    from lanectl.commands.build import build_lanes

    if bool(lanes_) == all_lanes:
        raise typer.BadParameter("name lanes to build, or --all (not both)")
    loaded = catalog()
    chosen = list(loaded.lanes.values()) if all_lanes else [loaded.lane(name) for name in lanes_ or []]
    outcomes = build_lanes(chosen, no_cache=no_cache, push=push, console=err, live=not as_json)
    if as_json:
        emit_json("build", {"builds": [o.__dict__ | {"log_tail": list(o.log_tail)} for o in outcomes]})
    else:
        for outcome in outcomes:
            colour = {"built": "green", "unchanged": "cyan", "failed": "red"}[outcome.status]
            out.print(Text.assemble((f"{outcome.status:<9}", colour), f" {outcome.lane}: {outcome.message}",
                                    " (pushed)" if outcome.pushed else ""))
            if outcome.status == "failed":
                err.print("[bold]last lines of the failing step:[/]")
                for line in outcome.log_tail:
                    err.print(f"  {line}", markup=False)
    if any(o.status == "failed" for o in outcomes):
        raise typer.Exit(EXIT_FAILED)


class ConsoleReporter:
    """Switch progress for people on stderr: one line per step, a live line while the gate waits."""

    def __init__(self, console: Console, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.last_gate_print = 0.0

    def step(self, text: str, *, ok: bool = True) -> None:
        if not self.quiet:
            mark = ("✓", "green") if ok else ("✗", "red")
            self.console.print(Text.assemble(mark, " ", text), highlight=False)

    def note(self, text: str) -> None:
        if not self.quiet:
            self.console.print(Text.assemble(("!", "yellow"), " ", text), highlight=False)

    def gate(self, progress: GateProgress) -> None:
        import time

        if self.quiet:
            return
        now = time.monotonic()
        # A line every 5 s (not every poll): readable in a terminal, a CI log and the cron mail alike.
        if now - self.last_gate_print < 5 and progress.missing:
            return
        self.last_gate_print = now
        waiting = "; ".join(progress.missing) or "all checks satisfied"
        self.console.print(f"  gate {progress.elapsed:5.0f}/{progress.budget:.0f} s  waiting for: {waiting}",
                           markup=False, highlight=False)


LockWaitOption = Annotated[str, typer.Option("--lock-wait", help="How long to wait for another lanectl "
                                                                 "command holding the host lock (e.g. 60s).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Print the planned steps; change nothing.")]
NoGpuOption = Annotated[bool, typer.Option("--no-gpu", help="Run without the recipe's GPU requests (demo, tests).")]
FleetOption = Annotated[bool, typer.Option("--fleet", help="On Docker Swarm: every node the lane is placed on, "
                                                           "canary first, one at a time.")]
NodesOption = Annotated[str | None, typer.Option("--nodes", help="With --fleet: the nodes, by hostname, "
                                                                 "comma-separated (default: the recipe's).")]
CanaryOption = Annotated[str | None, typer.Option("--canary", help="With --fleet: the node updated and gated "
                                                                   "first (default: the recipe's, else the first).")]


def _node_list(nodes: str | None, canary: str | None, fleet: bool) -> list[str]:
    from lanectl.errors import BadInput

    if (nodes or canary) and not fleet:
        raise BadInput("--nodes and --canary choose Swarm nodes; add --fleet")
    return [n.strip() for n in (nodes or "").split(",") if n.strip()]


def _finish_fleet(outcome: Any, as_json: bool) -> None:
    if as_json:
        emit_json("fleet-switch", outcome.as_dict())
        raise typer.Exit(outcome.exit_code)
    for node in outcome.nodes:
        out.print(f"  {node.node:<24} {node.result:<22} {node.detail}", markup=False, highlight=False)
    _print_outcome(outcome, "the failed node's service")


def _finish(outcome: SwitchOutcome, as_json: bool) -> None:
    if as_json:
        emit_json("switch", {"result": outcome.result, "message": outcome.message, "lane": outcome.lane,
                             "steps": list(outcome.steps), "diagnostics": outcome.diagnostics})
        raise typer.Exit(outcome.exit_code)
    _print_outcome(outcome, "the failed lane")


def _print_outcome(outcome: Any, failed: str) -> None:
    """The result line on stdout, the failed engine's last lines on stderr; exits with the outcome's code."""
    colour = "green" if outcome.exit_code == 0 else "red"
    out.print(Text.assemble((outcome.result, colour), ": ", outcome.message), highlight=False)
    if outcome.diagnostics.get("log_tail"):
        err.print(f"[bold]last log lines of {failed}:[/]")
        for line in outcome.diagnostics["log_tail"][-15:]:
            err.print(f"  {line}", markup=False, highlight=False)
    raise typer.Exit(outcome.exit_code)


@app.command()
def up(lane: Annotated[str, typer.Argument(help="Lane to serve, e.g. h2-REF.")],
       dry_run: DryRunOption = False,
       no_rollback: Annotated[bool, typer.Option(
           "--no-rollback", help="On a failed gate, leave the new lane stopped for debugging.")] = False,
       lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False, fleet: FleetOption = False,
       nodes: NodesOption = None, canary: CanaryOption = None, as_json: JsonOption = False) -> None:
    """Switch the box (or with --fleet, the Swarm nodes) to LANE, health-gated, or go back."""
    from lanectl.cli.durations import parse_duration
    from lanectl.commands.switch import dry_run_up, run
    from lanectl.fleet.rollout import require_placement

    loaded = catalog()
    target = loaded.lane(lane)
    chosen = _node_list(nodes, canary, fleet)
    require_placement(target, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands

        if no_rollback:
            from lanectl.errors import BadInput

            raise BadInput("--no-rollback is for local lanes; on Swarm a failed update is always rolled back")
        if dry_run:
            for line in fleet_commands.dry_run_up(loaded, target, chosen, canary):
                out.print(line, markup=False)
            return
        fleet_outcome = fleet_commands.run(
            lambda rollout: rollout.up(target, nodes=chosen, canary=canary), loaded, f"lanectl up {lane} --fleet",
            lock_wait=parse_duration(lock_wait, option="--lock-wait"), reporter=ConsoleReporter(err), no_gpu=no_gpu)
        _finish_fleet(fleet_outcome, as_json)
    if dry_run:
        for line in dry_run_up(loaded, target):
            out.print(line, markup=False)
        return
    outcome = run(lambda lanes: lanes.up(target, rollback_on_failure=not no_rollback), loaded, f"lanectl up {lane}",
                  lock_wait=parse_duration(lock_wait, option="--lock-wait"), reporter=ConsoleReporter(err),
                  no_gpu=no_gpu)
    _finish(outcome, as_json)


@app.command()
def rollback(to: Annotated[str | None, typer.Option("--to", help="Lane to go back to (default: the last "
                                                                 "known-good lane before the active one).")] = None,
             dry_run: DryRunOption = False, lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False,
             fleet: FleetOption = False, nodes: NodesOption = None, canary: CanaryOption = None,
             as_json: JsonOption = False) -> None:
    """Go back to the last known-good lane, through the same health-gated path as up (--fleet: Swarm's rollback)."""
    from lanectl.cli.durations import parse_duration
    from lanectl.commands.switch import dry_run_rollback, run

    loaded = catalog()
    target = loaded.lane(to) if to else None
    chosen = _node_list(nodes, canary, fleet)
    if fleet:
        from lanectl.commands import fleet as fleet_commands
        from lanectl.errors import BadInput
        from lanectl.fleet.rollout import require_placement

        if target is not None:
            require_placement(target, fleet=True)
        if dry_run:
            raise BadInput("--dry-run is not offered for rollback --fleet; `lanectl fleet status` shows each "
                           "node's previous lane")
        fleet_outcome = fleet_commands.run(
            lambda rollout: rollout.rollback(target, nodes=chosen, canary=canary), loaded,
            "lanectl rollback --fleet", lock_wait=parse_duration(lock_wait, option="--lock-wait"),
            reporter=ConsoleReporter(err), no_gpu=no_gpu)
        _finish_fleet(fleet_outcome, as_json)
    if dry_run:
        for line in dry_run_rollback(loaded, target):
            out.print(line, markup=False)
        return
    outcome = run(lambda lanes: lanes.rollback(target), loaded, "lanectl rollback" + (f" --to {to}" if to else ""),
                  lock_wait=parse_duration(lock_wait, option="--lock-wait"), reporter=ConsoleReporter(err),
                  no_gpu=no_gpu)
    _finish(outcome, as_json)


@app.command()
def down(lane: Annotated[str | None, typer.Argument(help="Lane to stop (default: the active lane).")] = None,
         lock_wait: LockWaitOption = "60s", as_json: JsonOption = False) -> None:
    """Stop a lane (companions first, then the primary); its containers are kept for a later start.
    Without LANE: the active lane and every lane waiting asleep as a standby."""
    from lanectl.cli.durations import parse_duration
    from lanectl.commands.switch import run
    from lanectl.errors import BadInput
    from lanectl.state.lanes import LaneStateStore
    from lanectl.state.paths import state_dir
    from lanectl.state.standby import STANDBY_FILE, StandbyStore

    loaded = catalog()
    name = lane or LaneStateStore(state_dir() / "state.json").load().active
    if name is None and not StandbyStore(state_dir() / STANDBY_FILE).load().standbys:
        raise BadInput("no active lane; name the lane to stop")
    target = loaded.lane(name) if name else None
    outcome = run(lambda lanes: lanes.down(target, with_standbys=lane is None), loaded,
                  f"lanectl down {lane or name or '(standbys)'}",
                  lock_wait=parse_duration(lock_wait, option="--lock-wait"), reporter=ConsoleReporter(err))
    _finish(outcome, as_json)


@app.command()
def status(as_json: JsonOption = False) -> None:
    """Lanes, containers, health, builds, the active and known-good lanes, the watchdog, unfinished switches."""
    from lanectl.commands.status import lane_status

    data = lane_status(catalog())
    if as_json:
        emit_json("status", data)
        return
    for lane in data["lanes"]:
        health = f"  health: {lane['health']}" if lane["health"] else ""
        standby = lane["standby"]
        asleep = ""
        if standby:
            resident = f", {standby['resident_gib']:g} GiB resident" if standby["resident_gib"] is not None else ""
            asleep = f"standby {standby['seconds']} s{resident}{'' if standby['alive'] else ', container gone'} "
        out.print(Text.assemble((lane["lane"], "bold"), "  ", ("active", "bold green") if lane["active"] else "",
                                " " if lane["active"] else "", (asleep, "bold cyan"),
                                "known-good " if lane["known_good"] else "",
                                f"{lane['image']}{'' if lane['built'] else ' (not built)'}{health}"),
                  highlight=False)
        for c in lane["containers"]:
            detail = f"up {c['uptime_seconds']} s" if c["uptime_seconds"] is not None else c["status"]
            if c["exit_code"] not in (None, 0):
                detail += f" (exit {c['exit_code']})"
            stale = ("", "") if c["current_build"] else (f"  older build {c['image']}", "yellow")
            out.print(Text.assemble(f"    {c['role']:<8} {c['name']:<40} {detail:<14} restarts {c['restarts']}",
                                    stale), highlight=False)
    watchdog = data["watchdog"]
    lease = watchdog["lease"]
    lease_text = (f"; lease until {lease['until']} ({lease['reason']}){' expired' if lease['expired'] else ''}"
                  if lease else "")
    out.print(f"watchdog: {'armed' if watchdog['armed'] else 'disarmed'}{lease_text}", markup=False, highlight=False)
    out.print(f"known-good: {', '.join(data['known_good']) or '-'}", markup=False, highlight=False)
    if data["unfinished_switch"]:
        u = data["unfinished_switch"]
        out.print(Text.assemble((f"unfinished {u['action']}", "red"),
                                f" {u['from'] or '-'} -> {u['to'] or '-'} since {u['ts']} "
                                f"({len(u['done_steps'])}/{len(u['steps'])} steps); the next up/rollback finishes "
                                f"or undoes it"), highlight=False)
    for problem in data["journal_problems"]:
        err.print(f"journal: {problem}", markup=False)
    for name in data["unknown_containers"]:
        err.print(f"container {name} has lanectl labels but its lane is not in the recipes", markup=False)


@fleet_app.command("status")
def fleet_status(as_json: JsonOption = False) -> None:
    """Every Swarm node, its GPUs and labels, which lane runs where, and whether it answers. Exit 1 if degraded."""
    from lanectl.commands.fleet import status as fleet_status_data

    try:
        loaded: Catalog | None = catalog()
    except LanectlError:
        loaded = None  # the fleet is what it is, whatever the local recipes say
    data = fleet_status_data(loaded)
    if as_json:
        emit_json("fleet-status", data)
    else:
        for node in data["nodes"]:
            colour = "green" if node["state"] == "ready" else "red"
            gpus = ", ".join(f"{k}={v}" for k, v in node["gpus"].items()) or "no GPUs advertised"
            labels = ", ".join(f"{k}={v}" for k, v in sorted(node["labels"].items())) or "-"
            out.print(Text.assemble((node["hostname"], "bold"), " ", (node["state"], colour),
                                    f" {node['availability']} {node['role']} {node['addr']}  {gpus}  labels: {labels}"),
                      highlight=False)
            if node["lease"]:
                out.print(f"    being changed by {node['lease']}", markup=False)
            for lane in node["lanes"]:
                health = f"  health: {lane['health']}" if lane["health"] else ""
                update = f"  last update: {lane['update']}" if lane["update"] else ""
                problem = (f"  {lane['problem']}", "red") if lane["problem"] else ("", "")
                failed = f"  failed tasks: {lane['failed_tasks']}" if lane["failed_tasks"] else ""
                row = f"    {lane['lane']:<20} {lane['role']:<8} task {lane['task']:<9}{health}{update}"
                out.print(Text.assemble(row, problem, failed), highlight=False)
            if not node["lanes"]:
                out.print("    no lanectl lanes", markup=False)
        for problem in data["problems"]:
            err.print(Text.assemble(("problem:", "red"), " ", problem), highlight=False)
    if not data["healthy"]:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def logs(lane: Annotated[str, typer.Argument(help="Lane whose logs to show.")],
         role: Annotated[str, typer.Option("--role", help="primary, or a companion role such as rtx.")] = "primary",
         follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
         since: Annotated[str | None, typer.Option("--since", help="Only lines newer than, e.g., 10m.")] = None,
         ) -> None:
    """The container logs of a lane's primary or companion."""
    import time

    from lanectl.cli.durations import parse_duration
    from lanectl.dockerapi.containers import ContainerEngine
    from lanectl.errors import BadInput

    target = catalog().lane(lane)
    if role not in target.roles:
        raise BadInput(f"lane {lane} has no role {role!r}; it has: {', '.join(target.roles)}")
    name = target.container_name(role)
    engine = ContainerEngine()
    if engine.container(name) is None:
        raise BadInput(f"{name} does not exist; `lanectl up {lane}` creates it")
    since_ts = time.time() - parse_duration(since, option="--since") if since else None
    if follow:
        for chunk in engine.follow_logs(name, since=since_ts):
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
    else:
        sys.stdout.write(engine.logs(name, since=since_ts))


@app.command()
def history(count: Annotated[int, typer.Option("-n", help="How many records.")] = 50,
            fleet: Annotated[bool, typer.Option("--fleet", help="The fleet journal (Swarm rollouts, per node).")]
            = False, as_json: JsonOption = False) -> None:
    """The journal: who switched what, when, why, every step and the outcome."""
    from lanectl.commands.history import describe, journal_tail

    data = journal_tail(count, fleet=fleet)
    if as_json:
        emit_json("history", data)
        return
    for record in data["records"]:
        out.print(describe(record), markup=False, highlight=False)
    for problem in data["problems"]:
        err.print(f"journal: {problem}", markup=False)


@app.command()
def doctor(as_json: JsonOption = False) -> None:
    """The host's readiness to run lanes; each finding with its fix. Exit 1 on any error."""
    from lanectl.commands.doctor import as_json as findings_json
    from lanectl.commands.doctor import diagnose

    try:
        loaded: Catalog | None = catalog()
    except LanectlError:
        loaded = None
    findings = diagnose(loaded)
    if as_json:
        emit_json("doctor", {"findings": findings_json(findings)})
    else:
        colours = {"ok": "green", "warn": "yellow", "error": "red"}
        for f in findings:
            out.print(Text.assemble((f"{f.severity:<5}", colours[f.severity]), f" {f.check}: {f.detail}"),
                      highlight=False)
            if f.fix:
                out.print(f"      fix: {f.fix}", markup=False, highlight=False)
    if any(f.severity == "error" for f in findings):
        raise typer.Exit(EXIT_FAILED)


KernelLogOption = Annotated[str | None, typer.Option(
    "--kernel-log", help="Where Xid lines come from: kmsg (default), file:/var/log/kern.log or 'cmd:dmesg'. "
                         "Default: $LANECTL_KERNEL_LOG, else kmsg.")]


def _watchdog(kernel_log: str | None = None, *, need_engine: bool = True):  # type: ignore[no-untyped-def]
    import os

    from lanectl.commands.watchdog import open_watchdog

    spec = kernel_log or os.environ.get("LANECTL_KERNEL_LOG")
    return open_watchdog(catalog(), spec, explicit=spec is not None, reporter=ConsoleReporter(err),
                         need_engine=need_engine)


@watchdog_app.command("check")
def watchdog_check(kernel_log: KernelLogOption = None, as_json: JsonOption = False) -> None:
    """One pass, for cron: exit 0 healthy, 1 acted or unhealthy, 2 misconfigured."""
    watchdog = _watchdog(kernel_log)
    result = watchdog.check()
    if as_json:
        emit_json("watchdog.check", result.as_dict())
    else:
        line = f"{result.lane or '-'}: {result.action}: {result.reason}"
        out.print(line + (f" -> {result.outcome}" if result.outcome else ""), markup=False, highlight=False)
    raise typer.Exit(result.exit_code)


@watchdog_app.command("run")
def watchdog_run(kernel_log: KernelLogOption = None) -> None:
    """Long-running and event-driven (Docker events, kernel log, probe interval): for a service manager."""
    import threading

    watchdog = _watchdog(kernel_log)
    stop = threading.Event()

    def show(result, why: str) -> None:  # type: ignore[no-untyped-def]
        if result.exit_code != 0 or why != "interval":
            err.print(f"[{why}] {result.lane or '-'}: {result.action}: {result.reason}"
                      + (f" -> {result.outcome}" if result.outcome else ""), markup=False, highlight=False)

    try:
        watchdog.run(stop, on_pass=show)
    except (KeyboardInterrupt, SystemExit):
        stop.set()


@watchdog_app.command("arm")
def watchdog_arm() -> None:
    """Arm the watchdog now (ends any maintenance lease)."""
    _watchdog(need_engine=False).arm()
    out.print("armed")


@watchdog_app.command("rearm")
def watchdog_rearm() -> None:
    """For cron: re-arm only when the maintenance lease has expired; idempotent."""
    _, message = _watchdog(need_engine=False).rearm()
    out.print(message, markup=False)


@watchdog_app.command("disarm")
def watchdog_disarm(
    duration: Annotated[str, typer.Option("--for", help="How long, e.g. 2h; the lease ends on its own.")],
    reason: Annotated[str, typer.Option("--reason", help="Why, for the journal and status.")],
) -> None:
    """Observe and record only, until the lease ends (or `watchdog arm`)."""
    from lanectl.cli.durations import parse_duration
    from lanectl.state.journal import current_user_at_host

    state = _watchdog(need_engine=False).disarm(parse_duration(duration, option="--for"), reason,
                                                current_user_at_host())
    lease = state.watchdog_lease
    out.print(f"disarmed until {lease.until if lease else '?'} ({reason})", markup=False)


@watchdog_app.command("status")
def watchdog_status(as_json: JsonOption = False) -> None:
    """Armed?, lease, last pass, last action, heartbeat age, counters."""
    from lanectl.commands.watchdog import watchdog_status as status_data

    data = status_data()
    if as_json:
        emit_json("watchdog.status", data)
        return
    lease = data["lease"]
    out.print(f"watchdog: {'armed' if data['armed'] else 'disarmed'}"
              + (f"; lease until {lease['until']} ({lease['reason']}, by {lease['by']})" if lease else ""),
              markup=False)
    out.print(f"active lane: {data['active'] or '-'}", markup=False)
    age = data["heartbeat_age_seconds"]
    out.print(f"last pass: {data['last_pass'] or 'never'} ({data['last_pass_result'] or '-'}); heartbeat "
              + (f"{age:.0f} s ago" if age is not None else "never"), markup=False)
    if data["last_action"]:
        action = data["last_action"]
        out.print(f"last action: {action['ts']} {action['action']}: {action['reason']} -> {action['outcome']}",
                  markup=False)
    out.print(f"restarts: {data['restarts_total'] or 0}; rollbacks: {data['rollbacks_total']}; "
              f"Xid: {data['xid_total'] or 0} (hardware {data['xid_hardware_total']})", markup=False)
    for problem in data["problems"]:
        err.print(problem, markup=False)


@watchdog_app.command("install")
def watchdog_install(
    cron: Annotated[bool, typer.Option("--cron", help="Write /etc/cron.d/lanectl.")] = False,
    systemd: Annotated[bool, typer.Option("--systemd", help="Write a systemd service for `watchdog run`.")] = False,
    dry_run: DryRunOption = False,
) -> None:
    """Write the cron file or systemd unit from the watchdog/ templates and say what was written."""
    from lanectl.commands.watchdog import install_units

    if cron == systemd:
        raise typer.BadParameter("choose --cron or --systemd")
    for message in install_units(cron=cron, dry_run=dry_run, recipes_dir=Project.locate(state.recipes).recipes_dir):
        out.print(message, markup=False)


def _levels(text: str) -> list[int]:
    from lanectl.errors import BadInput

    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise BadInput(f"--concurrency {text!r}: expected positive whole numbers separated by commas, e.g. 1,8,32")
    return levels


WorkloadOption = Annotated[str, typer.Option("--workload", help="A file under recipes/workloads/ (name) or a path.")]
ConcurrencyOption = Annotated[str, typer.Option("--concurrency", help="Concurrent streams per cell, e.g. 1,8,32.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Write results (JSON, and a plot for gate) here.")]


@app.command()
def bench(lane: Annotated[str | None, typer.Argument(help="The serving lane (default: the active one).")] = None,
          workload: WorkloadOption = "coding", concurrency: ConcurrencyOption = "1,8,32", out_dir: OutOption = None,
          as_json: JsonOption = False) -> None:
    """Measure the serving lane: tok/s, ms/step, TTFT and ITL per workload class and concurrency."""
    from lanectl.commands.gate import bench as run_bench

    loaded = catalog()
    data = run_bench(loaded, loaded.lane(lane) if lane else None, workload, _levels(concurrency), out_dir,
                     progress=lambda text: err.print(text, markup=False, highlight=False))
    if as_json:
        emit_json("bench", data)
        return
    out.print(f"{'cell':<22} {'tok/s':>9} {'ms/step':>8} {'TTFT p50':>9} {'ITL p99':>8} {'failed':>6}", markup=False)
    for key, cell in data["bench"]["cells"].items():
        out.print(f"{key:<22} {cell['output_tok_per_s']:>9.1f} {cell['ms_per_step'] or 0:>8.2f} "
                  f"{cell['ttft_p50_ms'] or 0:>8.1f}m {cell['itl_p99_ms'] or 0:>7.1f}m {cell['failed']:>6}",
                  markup=False)
    for note in data["bench"]["notes"]:
        err.print(note, markup=False)
    if data.get("run_dir"):
        err.print(f"results in {data['run_dir']}", markup=False)


@app.command()
def gate(candidate: Annotated[str, typer.Argument(help="The candidate lane, e.g. h2-REF.")],
         control: Annotated[str, typer.Option("--control", help="The control lane, e.g. h1-REF.")],
         bar: Annotated[float, typer.Option("--bar", help="Required candidate/control ratio, e.g. 1.025.")] = 1.025,
         promote: Annotated[bool, typer.Option("--promote", help="On PASS leave the candidate serving.")] = False,
         workload: WorkloadOption = "coding", concurrency: ConcurrencyOption = "1,8,32", out_dir: OutOption = None,
         lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False, as_json: JsonOption = False) -> None:
    """A/B/A bracket: control, candidate, control; PASS only above the bar and the controls' noise.
    Exit 0 on PASS, 1 on FAIL or INCONCLUSIVE."""
    from lanectl.cli.durations import parse_duration
    from lanectl.commands.gate import gate as run_gate_command
    from lanectl.commands.gate import report_table

    loaded = catalog()
    report, run_dir = run_gate_command(
        loaded, loaded.lane(candidate), loaded.lane(control), workload, _levels(concurrency), bar, promote, out_dir,
        parse_duration(lock_wait, option="--lock-wait"), no_gpu, ConsoleReporter(err, quiet=True),
        progress=lambda text: err.print(text, markup=False, highlight=False))
    data = report.as_dict()
    if as_json:
        emit_json("gate", {**data, "run_dir": str(run_dir) if run_dir else None})
    else:
        for line in report_table(data):
            out.print(line, markup=False, highlight=False)
        if run_dir:
            err.print(f"results and plot in {run_dir}", markup=False)
    raise typer.Exit(0 if report.verdict.value == "pass" else EXIT_FAILED)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A folder written by `lanectl gate --out`.")]) -> None:
    """The table of a gate run again, and its plot redrawn (ratios.png)."""
    from lanectl.commands.gate import load_report, plot, report_table

    data = load_report(run_dir)
    for line in report_table(data):
        out.print(line, markup=False, highlight=False)
    plot(data, run_dir / "ratios.png")
    err.print(f"plot: {run_dir / 'ratios.png'}", markup=False)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Python's default SIGTERM kills without running `finally`: the host lock would be left held.
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Click handles usage errors (exit 2) and typer.Exit itself; domain errors arrive here.
    try:
        app()
    except RecipeInvalid as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False)
        err.print(f"{len(exc.problems)} problem(s); nothing was built or started.")
        sys.exit(exc.exit_code)
    except LanectlError as exc:
        err.print(f"lanectl: {exc}", markup=False)
        sys.exit(exc.exit_code)
