#!/usr/bin/env bash
# Builds the stub engine's base images offline from Debian packages (BRIEF §6): no registry
# needed, which matters because these hosts reach no image registry.
#   lanectl/base-python:bookworm  python3 with http/json/asyncio, busybox applets (~61 MB)
#   lanectl/base-build:bookworm   the same plus gcc and the Python headers, for kernel stages
# Skips an image that already exists unless FORCE=1.
set -euo pipefail

suite=bookworm
hook=$(mktemp)
trap 'rm -f "$hook"' EXIT
cat >"$hook" <<'HOOK'
#!/bin/sh
# --variant=extract runs no maintainer scripts: link busybox applets and lay down passwd/group by hand.
set -e
root="$1"
for applet in $(chroot "$root" /bin/busybox --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
cp "$root/usr/share/base-passwd/passwd.master" "$root/etc/passwd"
cp "$root/usr/share/base-passwd/group.master" "$root/etc/group"
HOOK
chmod +x "$hook"

make_image() {
  local name=$1 packages=$2
  if [ "${FORCE:-0}" != 1 ] && docker image inspect "$name" >/dev/null 2>&1; then
    echo "base image $name exists (FORCE=1 to rebuild)"
    return
  fi
  echo "building base image $name from Debian $suite packages"
  mmdebstrap --quiet --variant=extract --include="$packages" --extract-hook="$hook \"\$1\"" "$suite" - \
    | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$name" >/dev/null
  docker image inspect "$name" --format "built $name ({{.Size}} bytes)"
}

runtime=python3-minimal,libpython3.11-stdlib,busybox-static,base-passwd
make_image lanectl/base-python:$suite "$runtime"
make_image lanectl/base-build:$suite "$runtime,libpython3.11-dev,python3.11-dev,gcc,libc6-dev"
