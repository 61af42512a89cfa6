#!/usr/bin/env bash
# Everything a fresh machine needs before the demo or the tests, and nothing it already has:
# Debian packages (docker.io, mmdebstrap), a running Docker engine, the venv, the base images.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v cron >/dev/null 2>&1 || need+=(cron)  # the watchdog's re-arm and check run from cron
command -v ip >/dev/null 2>&1 || need+=(iproute2)  # the fleet tests put a second engine in a network namespace
# The registry `build --push` pushes to in the tests (scripts/registry.sh starts it); openssl makes the
# certificate of the one the fleet tests' second engine pulls from.
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v curl >/dev/null 2>&1 || need+=(curl)  # scripts/registry.sh waits for the registry to answer
# The release note's HTML is checked in a real headless browser (tests/test_release_note.py); Debian's
# package, so CI has it too. It adds about a minute and ~300 MB to a fresh machine's set-up.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  if [ "$(id -u)" != 0 ]; then echo "setup: need root to install ${need[*]} (apt-get)" >&2; exit 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd (log: /var/log/lanectl-dockerd.log)"
  # No systemd here. Swarm tasks pull their image (by digest) as on any fleet node.
  nohup dockerd >/var/log/lanectl-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not come up; see /var/log/lanectl-dockerd.log" >&2; exit 1; }
fi

if [ ! -x .venv/bin/lanectl ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: creating .venv and installing lanectl with its plot, test and docs extras"
  python3 -m venv .venv
  # The plot extra too: the gate tests draw the plot (lanectl itself runs without matplotlib). The docs extra
  # in the same install, so that `make docs` can build beside the tests without installing into their venv.
  .venv/bin/pip install -q -e '.[plot,test,docs]'
  touch .venv/.installed .venv/.docs-installed
fi

bash images/base/make-base-images.sh
