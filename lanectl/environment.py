"""Every environment variable lanectl reads, with a line each: the one list the docs' variables page is written
from (scripts/docs_reference.py), `watchdog install` carries settings from, and a test holds to the code's reads.

A variable's name is read where `reader` says; `carried` ones are written into the watchdog's cron file and
systemd unit, so that the watchdog shares the operator's state, lock, recipes and engine (`path` ones must then be
absolute, since cron and systemd start elsewhere). Variables whose names a recipe chooses (its `secret_env`, its
alert webhook's) are listed under the name they have by default or as a pattern.
"""

from __future__ import annotations

from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    group: str
    meaning: str
    default: str
    reader: str  # the module that reads it
    carried: bool = False
    path: bool = False


WHERE = "Where lanectl keeps things"
ENGINE = "The Docker engine"
WATCHDOG = "The watchdog and its alerts"
BUILDS = "Builds and downloads"
CONTAINERS = "Containers"
TERMINAL = "The terminal"
TESTS = "Tests only"

GROUPS = (WHERE, ENGINE, WATCHDOG, BUILDS, CONTAINERS, TERMINAL, TESTS)

VARIABLES = (
    Variable("LANECTL_STATE_DIR", WHERE, "The state folder: active and known-good lanes, the journal, the watchdog's "
             "state, standbys, pushes.", "`/var/lib/lanectl` for root, else `$XDG_STATE_HOME/lanectl`",
             "lanectl.state.paths", carried=True, path=True),
    Variable("XDG_STATE_HOME", WHERE, "Where a user (not root) keeps state, when `LANECTL_STATE_DIR` is not set.",
             "`~/.local/state`", "lanectl.state.paths"),
    Variable("LANECTL_RECIPES", WHERE, "The recipes folder; the project (images/, kernels/, patches/) is its parent. "
             "`--recipes` overrides it.", "`./recipes`", "lanectl.project", carried=True, path=True),
    Variable("LANECTL_LOCK_DIR", WHERE, "The folder of the engine locks: every command that changes a Docker "
             "engine's lanes takes that engine's lock here.", "`/run/lock/lanectl`", "lanectl.state.lock",
             carried=True, path=True),
    Variable("LANECTL_CACHE_DIR", WHERE, "Downloaded upstream sources (vLLM sdists, kernel sources) and the "
             "validated-recipe cache.", "`$XDG_CACHE_HOME/lanectl`", "lanectl.project", carried=True, path=True),
    Variable("XDG_CACHE_HOME", WHERE, "Where the cache goes when `LANECTL_CACHE_DIR` is not set.", "`~/.cache`",
             "lanectl.project"),
    Variable("DOCKER_HOST", ENGINE, "The Docker engine lanectl talks to, as the docker CLI reads it "
             "(`unix:///…` or `tcp://host:port`).", "`unix:///var/run/docker.sock`", "lanectl.dockerapi.engine_api",
             carried=True),
    Variable("DOCKER_TLS_VERIFY", ENGINE, "Verify the engine's TLS certificate (any value but empty or `0`).",
             "not set: no verification", "lanectl.dockerapi.engine_api", carried=True),
    Variable("DOCKER_CERT_PATH", ENGINE, "The folder holding `ca.pem`, `cert.pem` and `key.pem` for a TLS engine.",
             "`~/.docker`", "lanectl.dockerapi.engine_api", carried=True, path=True),
    Variable("LANECTL_KERNEL_LOG", WATCHDOG, "Where `watchdog check`, `watchdog run` and `gate` read Xid lines: "
             "`kmsg`, `file:/var/log/kern.log` or `cmd:dmesg --raw`. `--kernel-log` overrides it.", "`kmsg`",
             "lanectl.commands.watchdog", carried=True),
    Variable("LANECTL_ALERT_WEBHOOK", WATCHDOG, "The alert webhook's URL (Slack-compatible JSON). A recipe may name "
             "another variable (`watchdog.alert.webhook_url_env`). A secret: keep it in the env file "
             "`watchdog install` names, never in the cron file or unit.", "not set: no alerts are sent",
             "lanectl.watchdog.alerts"),
    Variable("LANECTL_PYPI_INDEX", BUILDS, "The package index `pin check` and `patches check` download vLLM's "
             "sources from.", "`https://pypi.org/simple/`", "lanectl.image.upstream"),
    Variable("(each name in a lane's `secret_env`)", CONTAINERS, "A secret passed from lanectl's environment into "
             "the container at start (never into the image); `status` compares it by keyed digest only.",
             "not set: the container starts without it", "lanectl.dockerapi.containers"),
    Variable("TTY_COMPATIBLE", TERMINAL, "`1` or `0`: print colours and progress, or plain lines, whatever the "
             "output is (rich's own rule).", "colours only on a terminal", "lanectl.cli.terminal"),
    Variable("FORCE_COLOR", TERMINAL, "Any value but empty: colours even when the output is not a terminal.",
             "not set", "lanectl.cli.terminal"),
    Variable("LANECTL_TEST_CRASH_AFTER_STEP", TESTS, "The test suite's seam: end a switch abruptly after step N.",
             "not set", "lanectl.lanes.execute"),
    Variable("LANECTL_TEST_SIGNAL_AFTER_STEP", TESTS, "The test suite's seam: send signals to a switch after given "
             "steps (`N:SIGNAL,…`; `end:SIGNAL` once the switch has ended).", "not set", "lanectl.lanes.execute"),
    Variable("LANECTL_TEST_SWARM_MONITOR_SECONDS", TESTS, "The test suite's seam: a shorter Swarm update monitor.",
             "not set", "lanectl.fleet.rollout"),
)


def carried() -> tuple[str, ...]:
    """The settings the watchdog must share with the operator's commands, in the order its files list them."""
    return tuple(variable.name for variable in VARIABLES if variable.carried)


def carried_paths() -> tuple[str, ...]:
    return tuple(variable.name for variable in VARIABLES if variable.carried and variable.path)
