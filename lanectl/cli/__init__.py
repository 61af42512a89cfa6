"""The `lanectl` entry point. `lanectl --version` is answered here, before typer and the app are imported: they
are nearly all of what a version check would otherwise cost."""

import os
import sys


def version_line() -> str:
    from lanectl import __version__

    return f"lanectl {__version__}\n"


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        sys.stdout.write(version_line())
        return
    # lanectl uses no pydantic plugin, and looking for one reads the entry points of every installed
    # distribution when the first model class is made: a cost each command paid for nothing. A value the user
    # set is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from lanectl.cli.app import main as run_app

    run_app()
