#!/bin/sh
# The Debian packages `make test` runs real parts with, installed where missing (as root, with
# apt): those of the groups named (`booted`: the booted nodes' image's tools, so that it can be
# built while the rest install), or all but those after `--except`, else all; chromium with
# what it recommends, as before, the rest without, after one `apt-get update`. Without root or
# apt, nothing is installed and the tests that need a missing part skip, saying so.
#
#   .ci/test_packages.sh [GROUP...]
#   .ci/test_packages.sh --except GROUP...
set -eu

except=no
if [ "${1:-}" = --except ]; then except=yes; shift; fi

# package:group:what needs it
PACKAGES="
chromium:report:the run report's browser test
debootstrap:booted:booted local nodes' image
systemd-container:booted:booted local nodes (systemd-nspawn)
zstd:booted:booted local nodes' image
iptables:network:a lossy link's tests
slurm-wlm:slurm:the Slurm backend's tests (real daemons)
slurmdbd:slurm:Slurm's accounting
mariadb-server:slurm:Slurm's accounting database
munge:slurm:Slurm's authentication
podman:images:jobs in container images
catatonit:images:podman's init
runc:images:jobs in images run with it: crun refuses hybrid cgroups (bootstrap/container.py)
skopeo:images:the image lab's pushes
docker-registry:images:a registry on loopback
"

installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}

missing="" why=""
while IFS=: read -r package group need; do
  [ -n "$package" ] || continue
  case " $* " in
    *" $group "*) [ $except = no ] || continue ;;
    *) [ $# = 0 ] || [ $except = yes ] || continue ;;
  esac
  installed "$package" && continue
  missing="$missing $package"
  why="$why; $package ($need)"
done <<EOF
$PACKAGES
EOF
[ -n "$missing" ] || exit 0
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "not installing${missing} (needs root and apt): their tests skip"
  exit 0
fi
echo "installing${why#;}"
apt-get update -qq
export DEBIAN_FRONTEND=noninteractive
case " $missing " in
  *" chromium "*) apt-get install -y -qq chromium >/dev/null ;;
esac
rest=$(printf '%s\n' $missing | grep -vx chromium | tr '\n' ' ')
[ -z "$rest" ] || apt-get install -y -qq --no-install-recommends $rest >/dev/null
