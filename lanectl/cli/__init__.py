"""The `lanectl` entry point. `lanectl --version` is answered here, before typer and the app are imported: they
are nearly all of what a version check would otherwise cost."""

import sys


def version_line() -> str:
    from lanectl import __version__

    return f"lanectl {__version__}\n"


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        sys.stdout.write(version_line())
        return
    from lanectl.cli.app import main as run_app

    run_app()
