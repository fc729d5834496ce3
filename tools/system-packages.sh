#!/bin/sh
# Installs the Debian packages that some tests run for real (Prometheus, Chromium, Slurm), when
# this runs as root with apt-get; otherwise it names what is missing, once, and the tests that
# need it skip with a line of their own. `make test` calls it with the list in the Makefile.
set -u
missing=""
for pkg in "$@"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)
  case "$status" in
    *"ok installed"*) ;;
    *) missing="$missing $pkg" ;;
  esac
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages for the tests:$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || echo "apt-get update failed; trying the install anyway"
  # shellcheck disable=SC2086
  if apt-get install -y -qq --no-install-recommends $missing >/dev/null 2>&1; then
    exit 0
  fi
  echo "WARNING: apt-get could not install:$missing; the tests that need them will skip"
else
  echo "WARNING: missing Debian packages:$missing (install them as root: apt-get install$missing);" \
       "the tests that need them will skip"
fi
exit 0
