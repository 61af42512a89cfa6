#!/usr/bin/env bash
# A Docker registry for the tests and for trying `lanectl build --push` on one machine: Debian's docker-registry
# (the CNCF distribution registry 2.8), with its own config, storage, log and pid file under DIR.
#
#   scripts/registry.sh start DIR [--addr 127.0.0.1:5000] [--storage PATH] [--readonly] [--tls CERT KEY]
#   scripts/registry.sh stop DIR
#
# Docker trusts a registry on a loopback address without TLS; any other address needs --tls (and the CA in
# /etc/docker/certs.d/HOST:PORT/ca.crt of every engine that pushes or pulls). --readonly starts it in the
# registry's maintenance mode, which refuses every write. Deleting manifests is enabled: tests use it.
set -euo pipefail

usage() { echo "usage: $0 start DIR [--addr HOST:PORT] [--storage PATH] [--readonly] [--tls CERT KEY] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1 dir=$2
shift 2
[ "$action" != start ] || mkdir -p "$dir"
dir=$(cd "$dir" 2>/dev/null && pwd) || exit 0  # stop: no such folder, so nothing runs there
pidfile=$dir/registry.pid

running_pid() {
  # The pid file's process, if it is still this registry (a pid can be reused by an unrelated process).
  [ -f "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  local cmdline
  cmdline=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"serve $dir/config.yml"* ]] || return 1
  echo "$pid"
}

still_running() {
  # The process exists and has not exited (an exited child stays a zombie, state Z, until this shell reaps it).
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

case $action in
  start)
    addr=127.0.0.1:5000 storage=$dir/storage readonly=false cert= key=
    while [ $# -gt 0 ]; do
      case $1 in
        --addr) addr=$2; shift 2 ;;
        --storage) storage=$2; shift 2 ;;
        --readonly) readonly=true; shift ;;
        --tls) cert=$2 key=$3; shift 3 ;;
        *) usage ;;
      esac
    done
    command -v docker-registry >/dev/null || { echo "registry: docker-registry is not installed (apt-get install docker-registry)" >&2; exit 1; }
    if pid=$(running_pid); then echo "registry: already running in $dir (pid $pid)" >&2; exit 1; fi
    mkdir -p "$storage"
    {
      echo "version: 0.1"
      echo "log: {level: info, formatter: text}"
      echo "storage:"
      echo "  filesystem: {rootdirectory: \"$storage\"}"
      echo "  delete: {enabled: true}"
      echo "  maintenance: {readonly: {enabled: $readonly}}"
      echo "http:"
      echo "  addr: \"$addr\""
      if [ -n "$cert" ]; then echo "  tls: {certificate: \"$cert\", key: \"$key\"}"; fi
    } > "$dir/config.yml"
    # setsid: the registry outlives this script and is not in the caller's process group (a test runner's ^C).
    setsid docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    scheme=http curl_tls=()
    if [ -n "$cert" ]; then scheme=https curl_tls=(--cacert "$cert"); fi
    started_pid=$!
    for _ in $(seq 1 100); do
      # Alive, not what its cmdline says: until the forked child has exec'd docker-registry its cmdline is still
      # this script's, and a loaded machine can look in that window. The pid is our unreaped child, so not reused.
      if ! still_running "$started_pid"; then
        echo "registry: exited at start; last lines of $dir/registry.log:" >&2; tail -n 20 "$dir/registry.log" >&2; exit 1
      fi
      if [ "$(curl -s -o /dev/null -w '%{http_code}' "${curl_tls[@]}" "$scheme://$addr/v2/")" = 200 ]; then
        echo "registry: serving $scheme://$addr (storage $storage, log $dir/registry.log)"
        exit 0
      fi
      sleep 0.1
    done
    echo "registry: $scheme://$addr/v2/ did not answer within 10 s; see $dir/registry.log" >&2
    kill "$(cat "$pidfile")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    [ $# -eq 0 ] || usage
    if pid=$(running_pid); then
      kill "$pid"
      for _ in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
      [ ! -d "/proc/$pid" ] || kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    ;;
  *) usage ;;
esac
