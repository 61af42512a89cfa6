"""The `lanectl` command line: parse, call one command, render its result.

Exit codes everywhere: 0 success, 1 the operation failed, 2 bad input or usage.
"""

import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from lanectl.cli import version_line
from lanectl.errors import LanectlError, RecipeInvalid

if TYPE_CHECKING:
    from lanectl.cli.progress import ConsoleReporter
    from lanectl.cli.terminal import Console
    from lanectl.output import Result
    from lanectl.project import Project
    from lanectl.recipe.catalog import Catalog
    from lanectl.watchdog.runner import PassResult


class _LanectlGroup(TyperGroup):
    """Click handles usage errors (exit 2) and typer.Exit itself; domain errors are reported here, inside the
    command, so that an in-process run (typer's CliRunner) prints and exits exactly as the installed CLI does."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _USAGE_ERROR as exc:
            raise _escaped(exc) from None

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]  # typer.Context is its click's, narrower
        # The consoles are this run's: made for it (they read the environment, FORCE_COLOR and COLUMNS, and the
        # terminal when made) and dropped after it.
        out.cache_clear()
        err.cache_clear()
        try:
            return super().invoke(ctx)
        except _USAGE_ERROR as exc:
            raise _escaped(exc) from None
        except RecipeInvalid as exc:
            for problem in exc.problems:
                err().print(str(problem), markup=False)
            err().print(f"{len(exc.problems)} problem(s); nothing was built or started.")
            raise typer.Exit(exc.exit_code) from exc
        except LanectlError as exc:
            err().print(f"lanectl: {exc}", markup=False)
            raise typer.Exit(exc.exit_code) from exc
        finally:
            out.cache_clear()
            err.cache_clear()


# click's usage errors, as the click typer runs on raises them (typer 0.28 carries its own copy of click): the base
# of the exception class typer exports.
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _escaped(exc: Any) -> Exception:
    """A usage error quotes what was typed (`No such option: --x`): its control characters and bidi marks are
    shown escaped, as everything lanectl prints from outside is (lanectl.output.shown)."""
    from lanectl.output import shown

    exc.message = shown(exc.message, keep_newlines=True)
    return exc


def _typer(help: str, group: type[TyperGroup] = TyperGroup) -> typer.Typer:
    # Plain click help and usage errors: typer's rich help imports rich's tables, Markdown and markdown-it
    # (about 100 ms), which every `--help` and every mistyped option would pay.
    return typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None, help=help,
                       cls=group)


app = _typer("Run GPU LLM serving lanes safely: recipes to images, switches, rollback, watchdog.", _LanectlGroup)
patches_app = _typer("Backported patches and the upstream source they target.")
app.add_typer(patches_app, name="patches")
watchdog_app = _typer("The health watchdog of the active lane.")
app.add_typer(watchdog_app, name="watchdog")
fleet_app = _typer("Lanes on a fleet of boxes, run by Docker Swarm.")
app.add_typer(fleet_app, name="fleet")
standby_app = _typer("Standbys: lanes left asleep (vLLM sleep mode) so that a rollback is a wake.")
app.add_typer(standby_app, name="standby")


# Engine text (container logs, engine and webhook errors, health details) reaches these consoles:
# it is printed as parts or with markup=False, never parsed as rich markup, and with its control characters
# escaped (lanectl.cli.terminal). Made on first use, so that `--help`, `--version` and completion never
# import them, and one per run (_LanectlGroup.invoke): rich's where styles show, a plain one elsewhere.
@cache
def out() -> "Console":
    from lanectl.cli.terminal import console

    return console(stderr=False)


@cache
def err() -> "Console":
    from lanectl.cli.terminal import console

    return console(stderr=True)


def _project(recipes: Path | None) -> "Project":
    from lanectl.project import Project

    return Project.locate(recipes)

RecipesOption = Annotated[
    Path | None,
    typer.Option("--recipes", help="Recipes folder (default: $LANECTL_RECIPES, else ./recipes).",
                 show_default=False),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output (a versioned envelope).")]


class _State:
    recipes: Path | None = None


state = _State()


def complete_lane(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of lane names, from the recipes the command line names (or the default ones)."""
    from lanectl.commands.completion import lane_names

    return lane_names(_completion_project(ctx), incomplete)


def complete_recipe_path(ctx: typer.Context, incomplete: str) -> list[str]:
    from lanectl.commands.completion import recipe_paths

    return recipe_paths(_completion_project(ctx), incomplete)


def _completion_project(ctx: typer.Context) -> "Project":
    # While completing, click hands over --recipes as the text typed so far, not converted to a Path.
    recipes = ctx.find_root().params.get("recipes")
    return _project(Path(recipes) if recipes else None)


def _print_version(value: bool) -> None:
    # Eager, so it answers before click asks for a command ("Missing command", exit 2).
    if value:
        sys.stdout.write(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(recipes: RecipesOption = None,
          version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                                callback=_print_version)] = False) -> None:
    state.recipes = recipes


def show(result: "Result", as_json: bool = False) -> None:
    """The result as the envelope, or as its text view (stdout, notes on stderr); then its exit code."""
    if as_json:
        from lanectl.output import render_json

        sys.stdout.write(render_json(result))
    else:
        from lanectl.cli.views import render_text

        lines = render_text(result)
        # One print per run of lines on the same stream: the order within each stream is the view's. A span is
        # one line's part: a newline in it (from a log, a reason) is shown escaped.
        start = 0
        for end in range(1, len(lines) + 1):
            if end == len(lines) or lines[end].err != lines[start].err:
                (err() if lines[start].err else out()).lines(lines[i].spans for i in range(start, end))
                start = end
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def catalog() -> "Catalog":
    from lanectl.recipe.catalog import load_catalog

    return load_catalog(_project(state.recipes), [])


def readable() -> tuple["Catalog", tuple[str, ...]]:
    """The lanes of the recipes that load, and the problems of those that do not: `status` and `down` see and stop
    what runs whatever state the recipes are in (a lane no recipe that loads has is read from its labels)."""
    from lanectl.recipe.catalog import load_readable

    return load_readable(_project(state.recipes))


def _seconds(text: str, option: str) -> float:
    from lanectl.cli.durations import parse_duration

    return parse_duration(text, option=option)


@app.command()
def validate(paths: Annotated[list[Path] | None, typer.Argument(help="Recipe files or folders.",
                                                                 autocompletion=complete_recipe_path)] = None,
             as_json: JsonOption = False) -> None:
    """Check every recipe (or those given); exit 2 with every problem listed."""
    from lanectl.commands.validate import validate_recipes

    show(validate_recipes(_project(state.recipes), paths or []), as_json)


@app.command()
def lanes(as_json: JsonOption = False) -> None:
    """The lanes of all recipes: name, recipe, image tag, and whether the image is built."""
    from lanectl.commands.lanes import list_lanes

    show(list_lanes(catalog()), as_json)


@app.command()
def render(lane: Annotated[str, typer.Argument(help="Lane name, e.g. h2-REF.", autocompletion=complete_lane)],
           out_dir: Annotated[Path | None, typer.Option("--out", help="Write the build context here.")] = None,
           as_json: JsonOption = False) -> None:
    """The Dockerfile, build context and container specs of a lane; nothing is built."""
    from lanectl.commands.render import render_lane

    show(render_lane(catalog().lane(lane), out_dir), as_json)


@app.command()
def diff(a: Annotated[str, typer.Argument(help="The lane to compare from, e.g. h1-REF.", autocompletion=complete_lane)],
         b: Annotated[str, typer.Argument(help="The lane to compare to, e.g. h2-REF.", autocompletion=complete_lane)],
         as_json: JsonOption = False) -> None:
    """What differs between two lanes' rendered inputs (image, kernels, patches, serve flags, env, ports, volumes,
    companions, health, standby), and what is the same. Nothing is built."""
    from lanectl.commands.diff import diff as diff_lanes

    show(diff_lanes(catalog(), a, b), as_json)


@app.command()
def schema() -> None:
    """The JSON Schema of the recipe format, for editors (yaml-language-server)."""
    from lanectl.commands.schema import recipe_schema

    show(recipe_schema())


@patches_app.command("check")
def patches_check(as_json: JsonOption = False) -> None:
    """Each patch against the real pinned upstream source: applies | already-upstream | conflicts."""
    from lanectl.cli.progress import DownloadProgress
    from lanectl.commands.patches import check_project_patches

    show(check_project_patches(_project(state.recipes), progress=DownloadProgress(err())), as_json)


pin_app = _typer("The vLLM release the lanes pin, and what moving it would break.")
app.add_typer(pin_app, name="pin")


@pin_app.command("check")
def pin_check(version: Annotated[str, typer.Argument(help="The vLLM release to move to, e.g. 0.32.0.")],
              as_json: JsonOption = False) -> None:
    """Each lane against a vLLM release's own source: patches, startup rules, serve flags, caches, build steps."""
    from lanectl.cli.progress import DownloadProgress
    from lanectl.commands.pin import check_pin_command

    show(check_pin_command(_project(state.recipes), version, progress=DownloadProgress(err())), as_json)


@app.command()
def build(lanes_: Annotated[list[str] | None, typer.Argument(metavar="LANE...", help="Lanes to build.",
                                                                   autocompletion=complete_lane)] = None,
          all_lanes: Annotated[bool, typer.Option("--all", help="Build every lane.")] = False,
          push: Annotated[bool, typer.Option(
              "--push", help="Push each content tag and record the digest the registry returns (a tag the registry "
                             "already holds is neither built nor pushed again).")] = False,
          registry: Annotated[str | None, typer.Option(
              "--registry", metavar="HOST:PORT", help="Push here instead of the recipe's image.registry.",
              show_default=False)] = None,
          no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every step.")] = False,
          as_json: JsonOption = False) -> None:
    """Build lane images (content-addressed tags); unchanged inputs build nothing. Every lane is attempted; exit 1
    if any failed."""
    from lanectl.cli.progress import build_reporter
    from lanectl.commands.build import build_lanes

    if bool(lanes_) == all_lanes:
        raise typer.BadParameter("name lanes to build, or --all (not both)")
    if registry is not None and not push:
        raise typer.BadParameter("--registry is where --push pushes; add --push")
    loaded = catalog()
    chosen = list(loaded.lanes.values()) if all_lanes else [loaded.lane(name) for name in lanes_ or []]
    with build_reporter(err(), live=not as_json) as reporter:
        result = build_lanes(chosen, no_cache=no_cache, push=push, registry=registry, reporter=reporter)
    show(result, as_json)



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


def _node_list(nodes: str | None) -> list[str]:
    from lanectl.errors import BadInput

    named = [n.strip() for n in (nodes or "").split(",") if n.strip()]
    if nodes is not None and not named:  # an unset shell variable must not widen a rollout to every node
        raise BadInput("--nodes names no node; give hostnames (comma-separated), or leave --nodes out for the "
                       "recipe's nodes")
    return named


def _canary(canary: str | None) -> str | None:
    from lanectl.errors import BadInput

    if canary is not None and not canary.strip():
        raise BadInput("--canary names no node; give a hostname, or leave --canary out for the recipe's")
    return canary.strip() if canary is not None else None


def _reporter(quiet: bool = False) -> "ConsoleReporter":
    from lanectl.cli.progress import ConsoleReporter

    return ConsoleReporter(err(), quiet=quiet)


@app.command()
def up(lane: Annotated[str, typer.Argument(help="Lane to serve, e.g. h2-REF.", autocompletion=complete_lane)],
       dry_run: DryRunOption = False,
       no_rollback: Annotated[bool, typer.Option(
           "--no-rollback", help="On a failed gate, leave the new lane stopped for debugging.")] = False,
       lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False, fleet: FleetOption = False,
       nodes: NodesOption = None, canary: CanaryOption = None, as_json: JsonOption = False) -> None:
    """Switch the box (or with --fleet, the Swarm nodes) to LANE, health-gated, or go back."""
    from lanectl.commands import switch
    from lanectl.lanes.interrupt import Interrupt

    with Interrupt().held() as interrupt:
        show(switch.up(catalog(), lane, dry_run=dry_run, no_rollback=no_rollback, no_gpu=no_gpu, fleet=fleet,
                       nodes=_node_list(nodes), canary=_canary(canary), lock_wait=_seconds(lock_wait, "--lock-wait"),
                       reporter=_reporter(), interrupt=interrupt), as_json)


@app.command()
def rollback(to: Annotated[str | None, typer.Option("--to", help="Lane to go back to (default: the last "
                                                                 "known-good lane before the active one).",
                                                            autocompletion=complete_lane)] = None,
             dry_run: DryRunOption = False, lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False,
             fleet: FleetOption = False, nodes: NodesOption = None, canary: CanaryOption = None,
             as_json: JsonOption = False) -> None:
    """Go back to the last known-good lane, through the same health-gated path as up (--fleet: Swarm's rollback)."""
    from lanectl.commands import switch
    from lanectl.lanes.interrupt import Interrupt

    with Interrupt().held() as interrupt:
        show(switch.rollback(catalog(), to, dry_run=dry_run, no_gpu=no_gpu, fleet=fleet, nodes=_node_list(nodes),
                             canary=_canary(canary), lock_wait=_seconds(lock_wait, "--lock-wait"),
                             reporter=_reporter(), interrupt=interrupt), as_json)


@app.command()
def down(lane: Annotated[str | None, typer.Argument(help="Lane to stop (default: the active lane).",
                                                          autocompletion=complete_lane)] = None,
         dry_run: DryRunOption = False, lock_wait: LockWaitOption = "60s", as_json: JsonOption = False) -> None:
    """Stop a lane (companions first, then the primary); its containers are kept for a later start.
    Without LANE: the active lane and every lane waiting asleep as a standby. A lane no recipe that loads has
    (deleted, renamed, or its file broken) is stopped and removed as its containers' labels name it."""
    from lanectl.commands import switch
    from lanectl.lanes.interrupt import Interrupt

    recipes, problems = readable()
    with Interrupt().held() as interrupt:
        show(switch.down(recipes, lane, dry_run=dry_run, lock_wait=_seconds(lock_wait, "--lock-wait"),
                         reporter=_reporter(), recipe_problems=problems, interrupt=interrupt), as_json)


@app.command()
def status(as_json: JsonOption = False) -> None:
    """Lanes, containers, health, builds, the active and known-good lanes, the watchdog, unfinished switches.
    Lanes no recipe that loads has are shown from their containers' labels."""
    from lanectl.commands.status import lane_status

    show(lane_status(*readable()), as_json)


@fleet_app.command("status")
def fleet_status(as_json: JsonOption = False) -> None:
    """Every Swarm node, its GPUs and labels, which lane runs where, and whether it answers. Exit 1 if degraded."""
    from lanectl.commands.fleet import status as observe_fleet

    show(observe_fleet(state.recipes), as_json)


@app.command()
def logs(lane: Annotated[str, typer.Argument(help="Lane whose logs to show.", autocompletion=complete_lane)],
         role: Annotated[str, typer.Option("--role", help="primary, or a companion role such as rtx.")] = "primary",
         follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
         since: Annotated[str | None, typer.Option("--since", help="Only lines newer than, e.g., 10m.")] = None,
         ) -> None:
    """The container logs of a lane's primary or companion."""
    from lanectl.cli.terminal import shown
    from lanectl.commands.logs import lane_logs

    def write(text: str) -> None:
        # Log text goes out as the engine wrote it (control characters escaped): no markup, no wrapping,
        # flushed for `-f`.
        sys.stdout.write(shown(text, keep_newlines=True))
        sys.stdout.flush()

    show(lane_logs(catalog(), lane, role=role, follow=follow, write=write,
                   since_seconds=_seconds(since, "--since") if since else None))


@app.command()
def history(count: Annotated[int, typer.Option("-n", help="How many records.", min=1)] = 50,
            fleet: Annotated[bool, typer.Option("--fleet", help="The fleet journal (Swarm rollouts, per node).")]
            = False, as_json: JsonOption = False) -> None:
    """The journal: who switched what, when, why, every step and the outcome."""
    from lanectl.commands.history import journal_tail

    show(journal_tail(count, fleet=fleet), as_json)


@app.command()
def doctor(as_json: JsonOption = False) -> None:
    """The host's readiness to run lanes; each finding with its fix. Exit 1 on any error."""
    from lanectl.commands.doctor import doctor as diagnose

    show(diagnose(state.recipes), as_json)


KernelLogOption = Annotated[str | None, typer.Option(
    "--kernel-log", help="Where Xid lines come from: kmsg (default), file:/var/log/kern.log or 'cmd:dmesg --raw'. "
                         "Default: $LANECTL_KERNEL_LOG, else kmsg.")]


@watchdog_app.command("check")
def watchdog_check(kernel_log: KernelLogOption = None, as_json: JsonOption = False) -> None:
    """One pass, for cron: exit 0 healthy, 1 acted or unhealthy, 2 misconfigured."""
    from lanectl.commands import watchdog

    show(watchdog.check(catalog(), kernel_log, reporter=_reporter()), as_json)


@watchdog_app.command("run")
def watchdog_run(kernel_log: KernelLogOption = None) -> None:
    """Long-running and event-driven (Docker events, kernel log, probe interval): for a service manager."""
    import threading

    from lanectl.cli.views import pass_line
    from lanectl.commands import watchdog

    stop = threading.Event()

    def show_pass(result: "PassResult", why: str) -> None:
        if result.exit_code != 0 or why != "interval":
            err().print(f"[{why}] {pass_line(result.as_dict())}", markup=False, highlight=False)

    try:
        show(watchdog.run(catalog(), kernel_log, reporter=_reporter(), stop=stop, on_pass=show_pass))
    except (KeyboardInterrupt, SystemExit):
        stop.set()


@watchdog_app.command("arm")
def watchdog_arm() -> None:
    """Arm the watchdog now (ends any maintenance lease)."""
    from lanectl.commands import watchdog

    show(watchdog.arm(catalog(), reporter=_reporter()))


@watchdog_app.command("rearm")
def watchdog_rearm() -> None:
    """For cron: re-arm only when the maintenance lease has expired; idempotent."""
    from lanectl.commands import watchdog

    show(watchdog.rearm(catalog(), reporter=_reporter()))


@watchdog_app.command("disarm")
def watchdog_disarm(
    duration: Annotated[str, typer.Option("--for", help="How long, e.g. 2h; the lease ends on its own.")],
    reason: Annotated[str, typer.Option("--reason", help="Why, for the journal and status.")],
) -> None:
    """Observe and record only, until the lease ends (or `watchdog arm`)."""
    from lanectl.commands import watchdog

    show(watchdog.disarm(catalog(), _seconds(duration, "--for"), reason, reporter=_reporter()))


@watchdog_app.command("status")
def watchdog_status(as_json: JsonOption = False) -> None:
    """Armed?, lease, last pass, last action, heartbeat age, counters."""
    from lanectl.commands.watchdog import watchdog_status as status_of_watchdog

    show(status_of_watchdog(), as_json)


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
    show(install_units(cron=cron, dry_run=dry_run, recipes_dir=_project(state.recipes).recipes_dir))


# One thread per stream in the load generator; far more than any engine batches is a typo.
MAX_STREAMS = 4096


def _levels(text: str) -> list[int]:
    from lanectl.errors import BadInput

    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(not 1 <= level <= MAX_STREAMS for level in levels):
        raise BadInput(f"--concurrency {text!r}: expected whole numbers from 1 to {MAX_STREAMS} separated by "
                       "commas, e.g. 1,8,32")
    twice = sorted({level for level in levels if levels.count(level) > 1})
    if twice:
        raise BadInput(f"--concurrency {text!r}: {twice[0]} is named twice; name each level once")
    return levels


WorkloadOption = Annotated[str, typer.Option("--workload", help="A file under recipes/workloads/ (name) or a path.")]
ConcurrencyOption = Annotated[str, typer.Option("--concurrency", help="Concurrent streams per cell, e.g. 1,8,32.")]
OutOption = Annotated[Path | None, typer.Option("--out", help="Write results (JSON, and a plot for gate) here.")]


@app.command()
def bench(lane: Annotated[str | None, typer.Argument(help="The serving lane (default: the active one).",
                                                           autocompletion=complete_lane)] = None,
          workload: WorkloadOption = "coding", concurrency: ConcurrencyOption = "1,8,32", out_dir: OutOption = None,
          as_json: JsonOption = False) -> None:
    """Measure the serving lane: tok/s, ms/step, TTFT and ITL per workload class and concurrency."""
    from lanectl.cli.progress import say
    from lanectl.commands.gate import bench as measure

    show(measure(catalog(), lane, workload, _levels(concurrency), out_dir, progress=say(err())), as_json)


@app.command()
def gate(candidates: Annotated[list[str], typer.Argument(
             metavar="CANDIDATE...", help="The candidate lane(s), e.g. h2-REF; several share one bracket.",
             autocompletion=complete_lane)],
         control: Annotated[str | None, typer.Option("--control", help="The control lane, e.g. h1-REF.",
                                                             autocompletion=complete_lane)] = None,
         bar: Annotated[float, typer.Option("--bar", help="Required candidate/control ratio, e.g. 1.025.")] = 1.025,
         promote: Annotated[bool, typer.Option("--promote", help="On PASS leave the candidate serving (of several, "
                                                               "the best that passed).")] = False,
         order: Annotated[str, typer.Option("--order", help="Arm order: ABA (control, each candidate in turn, "
                                                            "control) or ABBA (the candidates mirrored: A, C1, "
                                                            "C2, C2, C1, A; one candidate: A, B, B, A).")] = "ABA",
         until_decided: Annotated[int, typer.Option("--until-decided", metavar="N", help="While a candidate is "
                                                    "INCONCLUSIVE only because no cell's interval is decisive yet, "
                                                    "run up to N more rounds (one more arm of it, then one more "
                                                    "control arm) and judge again.")] = 0,
         calibrate: Annotated[bool, typer.Option("--calibrate", help="Run --arms arms of CANDIDATE back to back "
                                                 "(A/A): report each cell's arm-to-arm noise, the coverage of A/A "
                                                 "intervals, the false-promotion rate and the smallest detectable "
                                                 "effect, and keep the noise for later gates of the workload on "
                                                 "this host.")] = False,
         arms: Annotated[int | None, typer.Option("--arms", metavar="N", help="With --calibrate: how many arms "
                                                  "(at least 3; default 8).")] = None,
         max_false_promotion: Annotated[float, typer.Option("--max-false-promotion", help="With --calibrate: "
                                                            "the highest false-promotion rate that exits 0.")] = 0.05,
         workload: WorkloadOption = "coding", concurrency: ConcurrencyOption = "1,8,32", out_dir: OutOption = None,
         lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False, as_json: JsonOption = False) -> None:
    """A bracket (A/B/A by default): control, candidate(s), control; a candidate PASSes only when a cell's 95%
    interval clears the bar, teacher-forced fidelity holds and the workload's probes pass. Every candidate is
    judged against the same control arms, with the same bar, fidelity reference and probes; --promote promotes
    the best that passed (highest ratio). Exit 0 when a candidate PASSed, 1 when none did, 2 on bad input
    (before anything switches)."""
    from lanectl.cli.progress import say
    from lanectl.commands.gate import gate as run_gate

    show(run_gate(catalog(), candidates, control, workload, _levels(concurrency), bar, promote, out_dir,
                  _seconds(lock_wait, "--lock-wait"), no_gpu, _reporter(quiet=True), progress=say(err()),
                  order=order.upper(), calibrate=calibrate, max_false_promotion=max_false_promotion,
                  until_decided=until_decided, arms=arms), as_json)


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A folder written by `lanectl gate --out`.")],
           release_note: Annotated[bool, typer.Option("--release-note", help="The run's release note in Markdown "
                                                      "(stdout, or --out FILE), written from results.json and "
                                                      "the recipes.")] = False,
           note_out: Annotated[Path | None, typer.Option("--out", help="With --release-note: write the Markdown "
                                                         "here instead of stdout.")] = None,
           html: Annotated[Path | None, typer.Option("--html", help="Write the release note as one HTML file, "
                                                     "with the plot inside it.")] = None,
           as_json: JsonOption = False) -> None:
    """The tables of a gate run again (text, or --json), and its plot redrawn (ratios.png); with --release-note
    or --html, the run's release note instead."""
    if release_note or html is not None:
        from lanectl.commands.release_note import report_release_note

        if note_out is not None and not release_note:
            raise typer.BadParameter("--out writes the Markdown note: add --release-note")
        try:
            recipes: Catalog | None = catalog()
        except LanectlError as exc:
            err().print(f"lanectl: the recipes could not be read ({exc}); the note leaves out what they say",
                      markup=False)
            recipes = None
        show(report_release_note(recipes, run_dir, note_out, html, print_markdown=release_note), as_json)
        return
    if note_out is not None:
        raise typer.BadParameter("--out writes the Markdown note: add --release-note")
    from lanectl.commands.gate import report as gate_report

    show(gate_report(run_dir), as_json)


@app.command()
def init(folder: Annotated[Path, typer.Argument(help="The new project's folder (created when missing).")]
         = Path("."),
         port: Annotated[int, typer.Option("--port", help="The host port the starter's lanes publish; choose "
                                                          "one no other service uses.")] = 18100,
         as_json: JsonOption = False) -> None:
    """Start a recipes project: a commented starter recipe with two stub-engine lanes (no GPU needed)."""
    from lanectl.commands.init import init_project

    show(init_project(folder, port), as_json)


@standby_app.command("check")
def standby_check(
        lane: Annotated[str, typer.Argument(help="The lane to prove sleep and wake on.", autocompletion=complete_lane)],
        cycles: Annotated[int, typer.Option("--cycles", metavar="N", help="Sleeps and wakes.")] = 10,
        beside: Annotated[str | None, typer.Option("--beside", metavar="LANE2", help="Start LANE2 beside LANE asleep, "
                                                   "at LANE2's --gpu-memory-utilization.",
                                                   autocompletion=complete_lane)] = None,
        streams: Annotated[int, typer.Option("--streams", help="Streams in flight at each sleep.")] = 4,
        yes: Annotated[bool, typer.Option("--yes", help="Stop the lanes that serve now (they come back after).")]
        = False,
        out_dir: Annotated[Path | None, typer.Option("--out", help="Write the report here (default: a new folder "
                                                     "under the state dir's standby-checks/).")] = None,
        lock_wait: LockWaitOption = "60s", no_gpu: NoGpuOption = False, as_json: JsonOption = False) -> None:
    """Prove on this box that LANE sleeps and wakes: start it cold, sleep (streams in flight) and wake it N times
    comparing its greedy output, read the memory it keeps, optionally start LANE2 beside it asleep. Writes a report
    and, when it passed, the recipe's standby block. Stops what serves (needs --yes then) and brings it back.
    Exit 0 passed, 1 failed (crash, engine-error, fingerprint-drift, slow-wake, oom-beside, beside-failed)."""
    from lanectl.commands.standby import check

    show(check(catalog(), lane, cycles=cycles, beside=beside, yes=yes, streams=streams, out_dir=out_dir,
               reporter=_reporter(), lock_wait=_seconds(lock_wait, "--lock-wait"), no_gpu=no_gpu), as_json)


import_app = _typer("Recipes from other formats, as lanectl recipes.")
app.add_typer(import_app, name="import")


@import_app.command("jm")
def import_jm(path: Annotated[Path, typer.Argument(help="A J-M-Recipes recipe folder (or its recipe.yaml).")],
              lane: Annotated[str, typer.Option("--lane", help="Name of the recipe's one lane.")] = "main",
              out_file: Annotated[Path | None, typer.Option("--out", help="Write the recipe here (a new file) "
                                                                         "instead of stdout.")] = None) -> None:
    """A jm-recipe/v1 recipe as a lanectl/v1 recipe; every field it cannot map is listed with its location."""
    from lanectl.commands.import_jm import import_jm_command

    show(import_jm_command(path, lane=lane, out_file=out_file))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Python's default SIGTERM kills without running `finally`: the host lock would be left held.
    raise SystemExit(128 + signum)


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # One program name however it was started (`python -m lanectl` too), so usage lines and the shell
    # completion's variable (_LANECTL_COMPLETE) are lanectl's.
    app(prog_name="lanectl")
