"""Installing the watchdog on a host: a cron file (`rearm` then `check` every minute) or a systemd unit (`run`).

Rendering is pure (templates in `watchdog/` in, `InstalledFile`s out); `install` is the only part
that touches the filesystem. Only a fixed list of non-secret variables (`CARRIED_VARIABLES`) is
rendered into the files, both of which are world-readable; secrets such as the alert webhook URL
stay in an operator-made env file that the files name but never read.
"""

from __future__ import annotations

import errno
import importlib.resources
import os
import re
import shlex
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template

from lanectl.environment import carried, carried_paths
from lanectl.errors import BadInput, OperationFailed
from lanectl.records import frozen
from lanectl.state.atomic import write_atomically

# Package data (lanectl/watchdog/templates/), so an installed wheel has them as a checkout does.
TEMPLATES_DIR = Path(str(importlib.resources.files("lanectl") / "watchdog" / "templates"))
CRON_FILE = Path("/etc/cron.d/lanectl")  # cron skips /etc/cron.d files whose names hold a dot
SYSTEMD_UNIT = Path("/etc/systemd/system/lanectl-watchdog.service")
DEFAULT_ENV_FILE = Path("/etc/lanectl/watchdog.env")
DEFAULT_LOG_FILE = Path("/var/log/lanectl-watchdog.log")
CRON_SCHEDULE = "* * * * *"
# cron and systemd both start jobs with a bare PATH; this one finds nvidia-smi and docker wherever Debian puts them.
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Non-secret settings the watchdog must share with the operator's commands: the same state (journal, lane
# state), the same engine lock, the same recipes, the same Docker engine, the same kernel log. Nothing else is
# rendered; lanectl.environment marks them.
CARRIED_VARIABLES = carried()
PATH_VARIABLES = carried_paths()
# Debian's cron reads at most 1000 characters of a command (MAX_COMMAND) and drops the rest silently.
CRON_MAX_COMMAND = 999
_SYSTEMD_PLAIN_WORD = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


@frozen
class InstalledFile:
    path: Path  # absolute, as on the host
    content: str
    mode: int

    def __post_init__(self) -> None:
        if not self.path.is_absolute():
            raise ValueError(f"an installed file needs an absolute path, got {self.path}")


def running_lanectl_command() -> list[str]:
    """How cron or systemd can start this same lanectl: `<venv python> -m lanectl`, absolute.

    `sys.executable` is made absolute but not resolved: in a venv it is a symlink to the system
    Python, and the resolved path would start a Python without lanectl's dependencies.
    """
    if not sys.executable:
        raise OperationFailed("cannot tell which Python runs lanectl (sys.executable is empty)")
    return [str(Path(sys.executable).absolute()), "-m", "lanectl"]


def render_cron(
    lanectl_command: list[str],
    environ: Mapping[str, str],
    *,
    env_file: Path = DEFAULT_ENV_FILE,
    log_file: Path = DEFAULT_LOG_FILE,
) -> InstalledFile:
    """`/etc/cron.d/lanectl`: as root every minute, `watchdog rearm` then `watchdog check`, appending to `log_file`.

    The command reads `env_file` first, but only if it exists and parses: `.` of a missing or
    broken file aborts a POSIX shell, and a typo in the alert settings must not stop the watchdog.
    """
    _check_command(lanectl_command)
    _check_absolute("the env file", env_file)
    _check_absolute("the log file", log_file)
    env = _cron_shell_word(str(env_file))
    lanectl = " ".join(_cron_shell_word(word) for word in lanectl_command)
    command = (
        f"{{ if [ -r {env} ] && (. {env}); then set -a; . {env}; set +a; fi; "
        f"{lanectl} watchdog rearm; {lanectl} watchdog check; }} >>{_cron_shell_word(str(log_file))} 2>&1"
    )
    if len(command) > CRON_MAX_COMMAND:
        raise BadInput(f"the cron command would be {len(command)} characters, over cron's limit of "
                       f"{CRON_MAX_COMMAND}; install lanectl, the env file or the log file under a shorter path")
    environment = [(name, _cron_env_value(name, value)) for name, value in _carried(environ)]
    content = _template("lanectl.cron.j2").render(
        path=str(CRON_FILE), env_file=str(env_file), search_path=SEARCH_PATH,
        environment=environment, schedule=CRON_SCHEDULE, command=command,
    )
    return InstalledFile(CRON_FILE, content, 0o644)


def render_systemd(
    lanectl_command: list[str],
    environ: Mapping[str, str],
    *,
    env_file: Path = DEFAULT_ENV_FILE,
) -> InstalledFile:
    """`/etc/systemd/system/lanectl-watchdog.service`, running `watchdog run`; its output goes to the journal."""
    _check_command(lanectl_command)
    _check_absolute("the env file", env_file)
    if any(character.isspace() for character in str(env_file)):
        raise BadInput(f"systemd's EnvironmentFile= cannot name a path with blanks: {str(env_file)!r}")
    environment = [_systemd_word(f"{name}={value}", expand_variables=False) for name, value in _carried(environ)]
    content = _template("lanectl-watchdog.service.j2").render(
        path=str(SYSTEMD_UNIT),
        env_file=str(env_file),
        env_file_setting=str(env_file).replace("%", "%%"),
        search_path_setting=_systemd_word(f"PATH={SEARCH_PATH}", expand_variables=False),
        environment=environment,
        exec_start=" ".join(_systemd_word(word) for word in [*lanectl_command, "watchdog", "run"]),
    )
    return InstalledFile(SYSTEMD_UNIT, content, 0o644)


def install(files: Iterable[InstalledFile], *, dry_run: bool, root: Path = Path("/")) -> list[str]:
    """Write each file under `root` with its mode, atomically; one message per file.

    A file that is already there with the same content and mode is left alone. `root` lets tests
    install into a temp folder.
    """
    messages: list[str] = []
    cron_folders: set[Path] = set()
    for file in files:
        target = root / file.path.relative_to("/")
        mode = f"{file.mode:04o}"
        if _already_installed(target, file):
            messages.append(f"{target} is up to date ({mode})")
        elif dry_run:
            messages.append(f"would write {target} ({mode})")
        else:
            _write_atomically(target, file.content.encode(), file.mode)
            messages.append(f"wrote {target} ({mode})")
            if target.parent.name == "cron.d":
                cron_folders.add(target.parent)
    for folder in cron_folders:
        _touch_in_the_next_second(folder)
    return messages


def _touch_in_the_next_second(folder: Path) -> None:
    """Make sure cron sees the files just written into `folder`.

    cron (Debian's) notices a change in /etc/cron.d by the folder's modification time, in whole seconds. A
    cron that looked in the same second as a write has already stored that time and misses the files
    written after its look, until the folder changes again: the watchdog would never run. Touching the
    folder once that second is over gives it a time cron has not seen.
    """
    now = time.time()
    time.sleep(int(now) + 1.01 - now)
    os.utime(folder)


def _template(name: str) -> Template:
    if not (TEMPLATES_DIR / name).is_file():
        raise OperationFailed(f"watchdog template {TEMPLATES_DIR / name} is missing: this lanectl install is "
                              f"incomplete; reinstall it")
    environment = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return environment.get_template(name)



def _carried(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    carried = [(name, environ[name]) for name in CARRIED_VARIABLES if environ.get(name)]
    for name, value in carried:
        if any(ord(character) < 32 for character in value):
            raise BadInput(f"${name} holds a control character (a line break?), which cannot go into a cron "
                           f"file or unit: {value!r}")
        if name in PATH_VARIABLES and not value.startswith("/"):
            raise BadInput(f"${name}={value} is a relative path, but cron and systemd do not start in this "
                           f"folder; set it to an absolute path and install again")
    return carried


def _check_command(lanectl_command: list[str]) -> None:
    if not lanectl_command or not lanectl_command[0].startswith("/"):
        raise BadInput(f"the lanectl command must start with an absolute path, got {lanectl_command!r}")
    for word in lanectl_command:
        if any(ord(character) < 32 for character in word):
            raise BadInput(f"the lanectl command holds a control character: {word!r}")


def _check_absolute(what: str, path: Path) -> None:
    if not path.is_absolute():
        raise BadInput(f"{what} must be an absolute path, got {path}")
    if any(ord(character) < 32 for character in str(path)):
        raise BadInput(f"{what} path holds a control character: {str(path)!r}")


def _cron_shell_word(word: str) -> str:
    # cron turns an unescaped % in a command into a line break (the rest becomes stdin), even inside quotes.
    return shlex.quote(word).replace("%", "\\%")


def _cron_env_value(name: str, value: str) -> str:
    # cron takes an environment value verbatim, except that matching outer quotes are stripped and
    # outer blanks dropped; such values would arrive changed, so they are refused.
    if value != value.strip() or value[0] in "'\"":
        raise BadInput(f"${name}={value!r} starts or ends with a blank or quote, which cron would not keep")
    return value


def _systemd_word(word: str, *, expand_variables: bool = True) -> str:
    # systemd expands %-specifiers in every setting, and $NAME in ExecStart=; both are escaped by doubling.
    escaped = word.replace("%", "%%")
    if expand_variables:
        escaped = escaped.replace("$", "$$")
    if _SYSTEMD_PLAIN_WORD.fullmatch(word):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _already_installed(target: Path, file: InstalledFile) -> bool:
    try:
        return target.read_text(encoding="utf-8") == file.content and (target.stat().st_mode & 0o7777) == file.mode
    except (OSError, UnicodeDecodeError):
        return False


def _write_atomically(target: Path, content: bytes, mode: int) -> None:
    """Cron and systemd never read half a file (see `write_atomically`)."""
    try:
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomically(target, content, mode=mode)
    except OSError as exc:
        hint = " (installing the watchdog needs root)" if exc.errno in (errno.EACCES, errno.EPERM) else ""
        raise OperationFailed(f"could not write {target}: {exc.strerror or exc}{hint}") from exc
