"""The watchdog's cron file and systemd unit: exact rendering, no secrets, installing, and a real cron run."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lanectl.errors import BadInput
from lanectl.watchdog.install import (
    CRON_FILE,
    SYSTEMD_UNIT,
    InstalledFile,
    install,
    render_cron,
    render_systemd,
    running_lanectl_command,
)

COMMAND = ["/opt/lanectl/.venv/bin/python", "-m", "lanectl"]
ENVIRON = {
    "LANECTL_STATE_DIR": "/var/lib/lanectl",
    "LANECTL_RECIPES": "/srv/lanes/recipes",
    "LANECTL_ALERT_WEBHOOK": "https://hooks.example/T0/SECRET",
    "HF_TOKEN": "hf_SECRET",
    "HOME": "/root",
    "PATH": "/root/.local/bin:/usr/bin",
}
ENV_FILE = Path("/etc/lanectl/watchdog.env")
LOG_FILE = Path("/var/log/lanectl-watchdog.log")

CRON = """\
# /etc/cron.d/lanectl: the lanectl watchdog, every minute, as root.
# Rendered by lanectl from its template lanectl.cron.j2: change the template and re-install rather than editing here.
# `rearm` ends a disarm lease that has run out; `check` probes the active lane and restarts it, rolls back or alerts.
# Use this file or the systemd service (lanectl-watchdog.service), not both.
#
# Secrets are not kept here (this file is world-readable). The alert webhook URL ($LANECTL_ALERT_WEBHOOK) goes in
# /etc/lanectl/watchdog.env, created by the operator with mode 0600 and one NAME='value' line per variable
# (single quotes: webhook URLs can hold & and ?). The command reads it before each run when it exists and parses.
SHELL=/bin/sh
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LANECTL_STATE_DIR=/var/lib/lanectl
LANECTL_RECIPES=/srv/lanes/recipes
* * * * * root { if [ -r /etc/lanectl/watchdog.env ] && (. /etc/lanectl/watchdog.env); then set -a; \
. /etc/lanectl/watchdog.env; set +a; fi; /opt/lanectl/.venv/bin/python -m lanectl watchdog rearm; \
/opt/lanectl/.venv/bin/python -m lanectl watchdog check; } >>/var/log/lanectl-watchdog.log 2>&1
"""

SYSTEMD = """\
# /etc/systemd/system/lanectl-watchdog.service: the lanectl watchdog as a long-running service (`lanectl watchdog run`).
# Rendered by lanectl from its template lanectl-watchdog.service.j2: change the template and re-install rather than
# editing here. Use this unit or the cron file (/etc/cron.d/lanectl), not both.
#
# Secrets are not kept here (units are world-readable). The alert webhook URL ($LANECTL_ALERT_WEBHOOK) goes in
# /etc/lanectl/watchdog.env, created by the operator with mode 0600 and one NAME='value' line per variable.
[Unit]
Description=lanectl watchdog: health checks, capped restarts, rollback and alerts for the active serving lane
# Wants, not Requires: a Docker restart must not stop the watchdog, which reports an unreachable engine itself.
Wants=docker.service network-online.target
After=docker.service network-online.target
# A watchdog that fails at start would otherwise be restarted forever: after 5 failed starts within
# 10 minutes systemd gives up, and `systemctl status lanectl-watchdog` shows why.
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
Type=simple
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
Environment=LANECTL_STATE_DIR=/var/lib/lanectl
Environment=LANECTL_RECIPES=/srv/lanes/recipes
EnvironmentFile=-/etc/lanectl/watchdog.env
ExecStart=/opt/lanectl/.venv/bin/python -m lanectl watchdog run
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target
"""


def job_line(cron_file: InstalledFile) -> str:
    [line] = [line for line in cron_file.content.splitlines() if line.startswith("* * * * * ")]
    return line


def as_cron_runs_it(cron_file: InstalledFile) -> str:
    """The shell command cron hands to /bin/sh for the job: after the user field, `\\%` turned back into `%`."""
    command = job_line(cron_file).removeprefix("* * * * * root ")
    assert not re.search(r"(?<!\\)%", command), "an unescaped % would cut the command short"
    return command.replace("\\%", "%")


def test_cron_file_exactly() -> None:
    cron = render_cron(COMMAND, ENVIRON, env_file=ENV_FILE, log_file=LOG_FILE)
    assert cron == InstalledFile(CRON_FILE, CRON, 0o644)


def test_cron_file_name_and_form_are_what_cron_accepts() -> None:
    cron = render_cron(COMMAND, ENVIRON, env_file=ENV_FILE, log_file=LOG_FILE)
    # Debian's cron runs /etc/cron.d files only if their names are letters, digits, _ and - (no dots).
    assert re.fullmatch(r"[A-Za-z0-9_-]+", cron.path.name)
    assert cron.path.parent == Path("/etc/cron.d")
    assert cron.content.endswith("\n")  # cron drops a last line without its newline
    assert cron.mode == 0o644


def test_no_environment_value_but_the_carried_ones_is_rendered() -> None:
    for unit in (render_cron(COMMAND, ENVIRON, env_file=ENV_FILE, log_file=LOG_FILE),
                 render_systemd(COMMAND, ENVIRON, env_file=ENV_FILE)):
        assert "SECRET" not in unit.content
        assert "hooks.example" not in unit.content
        assert "/root/.local/bin" not in unit.content
        assert "/etc/lanectl/watchdog.env" in unit.content


def test_percent_signs_are_escaped_for_cron() -> None:
    cron = render_cron(["/opt/lane%ctl/python", "-m", "lanectl"], {}, env_file=Path("/etc/lanectl/w%.env"),
                       log_file=Path("/var/log/lanectl-%d.log"))
    line = job_line(cron)
    assert "/opt/lane\\%ctl/python -m lanectl watchdog rearm" in line
    assert ">>/var/log/lanectl-\\%d.log 2>&1" in line
    assert "[ -r /etc/lanectl/w\\%.env ]" in line
    assert not re.search(r"(?<!\\)%", line)


def test_words_are_shell_quoted() -> None:
    cron = render_cron(["/opt/my lanectl/python", "-m", "lanectl"], {}, env_file=ENV_FILE, log_file=LOG_FILE)
    assert "'/opt/my lanectl/python' -m lanectl watchdog check;" in job_line(cron)


def test_without_carried_variables_only_shell_and_path_are_set() -> None:
    cron = render_cron(COMMAND, {"LANECTL_ALERT_WEBHOOK": "https://hooks.example/T0/SECRET"},
                       env_file=ENV_FILE, log_file=LOG_FILE)
    settings = [line for line in cron.content.splitlines() if re.match(r"[A-Z_]+=", line)]
    assert settings == ["SHELL=/bin/sh", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def test_docker_host_is_carried_so_the_watchdog_sees_the_same_engine() -> None:
    cron = render_cron(COMMAND, {"DOCKER_HOST": "unix:///run/user/0/docker.sock"}, env_file=ENV_FILE,
                       log_file=LOG_FILE)
    assert "\nDOCKER_HOST=unix:///run/user/0/docker.sock\n" in cron.content


WHERE_THINGS_LIVE = {
    "LANECTL_STATE_DIR": "/srv/lanectl/state",
    "LANECTL_RECIPES": "/srv/lanes/recipes",
    "LANECTL_LOCK_DIR": "/srv/lanectl/locks",
    "LANECTL_CACHE_DIR": "/srv/lanectl/cache",
}


def test_every_setting_of_where_state_locks_and_recipes_live_is_carried() -> None:
    """A box that sets LANECTL_LOCK_DIR must run its watchdog on the same lock as its operator's commands."""
    cron = render_cron(COMMAND, WHERE_THINGS_LIVE, env_file=ENV_FILE, log_file=LOG_FILE).content
    unit = render_systemd(COMMAND, WHERE_THINGS_LIVE, env_file=ENV_FILE).content
    for name, value in WHERE_THINGS_LIVE.items():
        assert f"\n{name}={value}\n" in cron, name
        assert f"\nEnvironment={name}={value}\n" in unit, name


def test_a_relative_lock_folder_is_refused() -> None:
    with pytest.raises(BadInput, match=r"\$LANECTL_LOCK_DIR=locks is a relative path"):
        render_cron(COMMAND, {"LANECTL_LOCK_DIR": "locks"}, env_file=ENV_FILE, log_file=LOG_FILE)


@pytest.mark.parametrize(
    ("command", "environ", "message"),
    [
        (["lanectl"], {}, "the lanectl command must start with an absolute path"),
        ([], {}, "the lanectl command must start with an absolute path"),
        (COMMAND, {"LANECTL_RECIPES": "recipes"}, "$LANECTL_RECIPES=recipes is a relative path"),
        (COMMAND, {"LANECTL_STATE_DIR": "/var/lib/x\n* * * * * root rm -rf /"}, "holds a control character"),
        (COMMAND, {"LANECTL_STATE_DIR": "/var/lib/x "}, "starts or ends with a blank or quote"),
        (["/" + "x" * 400, "-m", "lanectl"], {}, "over cron's limit of 999"),
    ],
)
def test_what_cron_cannot_take_is_refused(command: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(BadInput) as caught:
        render_cron(command, environ, env_file=ENV_FILE, log_file=LOG_FILE)
    assert message in str(caught.value)


def test_a_relative_log_file_is_refused() -> None:
    with pytest.raises(BadInput, match="the log file must be an absolute path, got watchdog.log"):
        render_cron(COMMAND, {}, env_file=ENV_FILE, log_file=Path("watchdog.log"))


def test_the_command_survives_a_missing_or_broken_env_file(tmp_path: Path) -> None:
    """What cron would run, run by /bin/sh: `. missing` or a syntax error would abort a POSIX shell."""
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-lanectl"
    fake.write_text(f'#!/bin/sh\necho "$*" "hook=$LANECTL_ALERT_WEBHOOK" >> {calls}\necho "ran $*"\n')
    fake.chmod(0o755)
    env_file = tmp_path / "watchdog.env"
    log = tmp_path / "watchdog.log"
    command = as_cron_runs_it(render_cron([str(fake)], {}, env_file=env_file, log_file=log))

    def run() -> list[str]:
        calls.unlink(missing_ok=True)
        subprocess.run(["/bin/sh", "-c", command], env={"PATH": "/usr/bin:/bin"}, check=True)
        return calls.read_text().splitlines()

    assert run() == ["watchdog rearm hook=", "watchdog check hook="]
    env_file.write_text("LANECTL_ALERT_WEBHOOK='https://hooks.example/T0/SECRET?a=1&b=2'\n")
    assert run() == ["watchdog rearm hook=https://hooks.example/T0/SECRET?a=1&b=2",
                     "watchdog check hook=https://hooks.example/T0/SECRET?a=1&b=2"]
    env_file.write_text("LANECTL_ALERT_WEBHOOK='unterminated\n")
    assert run() == ["watchdog rearm hook=", "watchdog check hook="]
    assert "ran watchdog rearm\nran watchdog check\n" in log.read_text()


def test_systemd_unit_exactly() -> None:
    unit = render_systemd(COMMAND, ENVIRON, env_file=ENV_FILE)
    assert unit == InstalledFile(SYSTEMD_UNIT, SYSTEMD, 0o644)


def test_systemd_specifiers_variables_and_blanks_are_escaped() -> None:
    unit = render_systemd(["/opt/my lanectl/py$thon%", "-m", "lanectl"], {"LANECTL_STATE_DIR": "/var/lib/lane%s"},
                          env_file=Path("/etc/lanectl/w%.env"))
    assert '\nExecStart="/opt/my lanectl/py$$thon%%" -m lanectl watchdog run\n' in unit.content
    assert "\nEnvironment=LANECTL_STATE_DIR=/var/lib/lane%%s\n" in unit.content
    assert "\nEnvironmentFile=-/etc/lanectl/w%%.env\n" in unit.content


def test_install_writes_each_file_with_its_mode(tmp_path: Path) -> None:
    files = [render_cron(COMMAND, ENVIRON, env_file=ENV_FILE, log_file=LOG_FILE),
             render_systemd(COMMAND, ENVIRON, env_file=ENV_FILE)]

    messages = install(files, dry_run=False, root=tmp_path)

    cron = tmp_path / "etc/cron.d/lanectl"
    unit = tmp_path / "etc/systemd/system/lanectl-watchdog.service"
    assert messages == [f"wrote {cron} (0644)", f"wrote {unit} (0644)"]
    assert cron.read_text() == CRON and unit.read_text() == SYSTEMD
    assert cron.stat().st_mode & 0o7777 == 0o644
    assert unit.stat().st_mode & 0o7777 == 0o644
    assert os.listdir(cron.parent) == ["lanectl"]  # no temp file left behind

    assert install(files, dry_run=False, root=tmp_path) == [f"{cron} is up to date (0644)",
                                                             f"{unit} is up to date (0644)"]


def test_cron_sees_the_folder_change_after_the_second_it_may_have_looked_in(tmp_path: Path) -> None:
    # cron compares /etc/cron.d's modification time in whole seconds with the one it last saw: the folder must
    # change once more after the second of the write, or a cron that looked in that second misses the file.
    [cron] = [render_cron(COMMAND, {}, env_file=ENV_FILE, log_file=LOG_FILE)]
    install([cron], dry_run=False, root=tmp_path)
    folder = tmp_path / "etc/cron.d"
    assert int(folder.stat().st_mtime) > int((folder / "lanectl").stat().st_mtime)


def test_install_fixes_a_wrong_mode(tmp_path: Path) -> None:
    [cron] = [render_cron(COMMAND, {}, env_file=ENV_FILE, log_file=LOG_FILE)]
    install([cron], dry_run=False, root=tmp_path)
    target = tmp_path / "etc/cron.d/lanectl"
    target.chmod(0o666)  # cron refuses files that others can write

    assert install([cron], dry_run=False, root=tmp_path) == [f"wrote {target} (0644)"]
    assert target.stat().st_mode & 0o7777 == 0o644


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    files = [render_cron(COMMAND, ENVIRON, env_file=ENV_FILE, log_file=LOG_FILE)]

    assert install(files, dry_run=True, root=tmp_path) == [f"would write {tmp_path}/etc/cron.d/lanectl (0644)"]
    assert os.listdir(tmp_path) == []


def test_the_running_lanectl_command_starts_this_lanectl() -> None:
    command = running_lanectl_command()
    assert Path(command[0]).is_absolute()
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert "lanectl" in result.stdout


# --- a real cron ----------------------------------------------------------------------------------


@pytest.fixture
def running_cron() -> Iterator[None]:
    """cron running on this host: the one already running, or one this fixture starts (and stops after)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test writes /etc/cron.d and may install and start cron")
    cron = shutil.which("cron", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if cron is None:
        cron = _install_cron()
    if subprocess.run(["pgrep", "-x", "cron"], capture_output=True).returncode == 0:
        yield
        return
    daemon = subprocess.Popen([cron, "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


def _install_cron() -> str:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_cron = ["apt-get", "install", "-y", "--no-install-recommends", "cron"]
    result = subprocess.run(install_cron, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env)
        result = subprocess.run(install_cron, capture_output=True, text=True, env=env)
    cron = shutil.which("cron", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if cron is None:
        pytest.skip(f"cron is not installed and `apt-get install cron` failed: {result.stderr.strip()[-300:]}")
    return cron


def test_a_real_cron_runs_the_rendered_file(running_cron: None, tmp_path: Path) -> None:
    """The rendered file, under a unique name in the real /etc/cron.d, run by the real cron within a minute.

    The job runs a stand-in for lanectl from a folder with `%` in its name, so the run also proves
    cron's `\\%` escaping, the carried state folder and the env file reach the command.
    """
    work = tmp_path / "cron%run"
    work.mkdir()
    calls = work / "calls"
    fake = work / "fake-lanectl"
    fake.write_text(f'#!/bin/sh\necho "$* state=$LANECTL_STATE_DIR hook=$LANECTL_ALERT_WEBHOOK" >> \'{calls}\'\n'
                    f'echo "ran $*"\n')
    fake.chmod(0o755)
    env_file = work / "watchdog.env"
    env_file.write_text("LANECTL_ALERT_WEBHOOK='https://hooks.example/T0/SECRET?a=1&b=2'\n")
    env_file.chmod(0o600)
    log = work / "watchdog.log"
    state = work / "state"
    rendered = render_cron([str(fake)], {"LANECTL_STATE_DIR": str(state)}, env_file=env_file, log_file=log)
    cron_file = dataclasses.replace(rendered, path=Path(f"/etc/cron.d/lanectl-test-{uuid.uuid4().hex[:12]}"))
    # And this very lanectl, end to end, in the same minute: its pass leaves a heartbeat.
    real_state, real_log = tmp_path / "real-state", tmp_path / "real.log"
    real = render_cron(running_lanectl_command(), {"LANECTL_STATE_DIR": str(real_state),
                                                   "LANECTL_RECIPES": str(Path(__file__).parent.parent / "recipes")},
                       env_file=env_file, log_file=real_log)
    real_file = dataclasses.replace(real, path=Path(f"/etc/cron.d/lanectl-test-{uuid.uuid4().hex[:12]}"))

    try:
        assert install([cron_file, real_file], dry_run=False) == [f"wrote {cron_file.path} (0644)",
                                                                 f"wrote {real_file.path} (0644)"]
        deadline = time.monotonic() + 150  # the next minute, or the one after if the file landed on the boundary
        while time.monotonic() < deadline and (len(_lines(calls)) < 2 or "nothing to watch" not in
                                               "".join(_lines(real_log))):
            time.sleep(1)
    finally:
        cron_file.path.unlink(missing_ok=True)
        real_file.path.unlink(missing_ok=True)

    assert "no active lane: nothing to watch" in real_log.read_text(), real_log.read_text()
    assert json.loads((real_state / "watchdog.json").read_text())["heartbeat"]

    hook = "https://hooks.example/T0/SECRET?a=1&b=2"
    assert _lines(calls)[:2] == [f"watchdog rearm state={state} hook={hook}",
                                 f"watchdog check state={state} hook={hook}"]
    assert log.read_text().startswith("ran watchdog rearm\nran watchdog check\n")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def test_the_dry_run_prints_the_file_line_by_line(tmp_path: Path) -> None:
    from tests.cli_in_process import run_cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("LANECTL_")}
    env.update({"LANECTL_STATE_DIR": str(tmp_path / "state"), "LANECTL_RECIPES": str(tmp_path / "recipes")})
    result = run_cli("watchdog", "install", "--cron", "--dry-run", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "\\x0a" not in result.stdout
    lines = result.stdout.splitlines()
    assert "SHELL=/bin/sh" in lines and f"LANECTL_STATE_DIR={tmp_path}/state" in lines
