#!/usr/bin/env bash
# make docs: the docs site from docs/ and mkdocs.yml into site/, with --strict (a broken link, a page missing from
# the nav or a warning fails it). Installs the pinned `docs` extra into .venv on first use; the references (recipe
# fields, a page per command, environment variables) are generated while it builds (scripts/docs_reference.py, an
# MkDocs hook), so they follow the code.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if [ ! -x .venv/bin/mkdocs ] || [ pyproject.toml -nt .venv/.docs-installed ]; then
  echo "docs: installing lanectl with its docs extra into .venv"
  .venv/bin/pip install -q -e '.[docs]'
  touch .venv/.docs-installed
fi
export NO_MKDOCS_2_WARNING=1  # the theme's end-of-life notice, printed on every build
exec .venv/bin/mkdocs build --strict --site-dir site "$@"
