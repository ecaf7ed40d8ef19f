#!/usr/bin/env bash
# Debian packages labkit needs from the system, installed only when missing:
#   vulkan    mesa-vulkan-drivers + libvulkan1 (lavapipe), so wgpu does not fall back to
#             OpenGL (no f16, no subgroups);
#   chromium  Debian's /usr/bin/chromium for the browser test (Playwright drives it; its own
#             browser download does not work here).
set -eu
have_vulkan() {
  # No `| grep -q` pipelines: under pipefail a missing directory (ls exit 2) or an
  # early-closed pipe (SIGPIPE) would read as "no driver" even when one is installed.
  local found=0 f
  for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json; do
    [ -e "$f" ] && found=1
  done
  [ "$found" = 1 ] || return 1
  ldconfig -p 2>/dev/null | grep 'libvulkan.so.1' >/dev/null
}
have_chromium() { [ -x /usr/bin/chromium ]; }

case "${1:-}" in
  vulkan) check=have_vulkan; packages="mesa-vulkan-drivers libvulkan1"; what="a Vulkan driver (lavapipe)" ;;
  chromium) check=have_chromium; packages="chromium"; what="Debian's chromium" ;;
  *) echo "usage: $0 vulkan|chromium" >&2; exit 2 ;;
esac

if $check; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "labkit: $what not found; installing Debian's $packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $packages >/dev/null
  $check && exit 0
fi
echo "labkit: error: $what is missing. Install it with: sudo apt-get install $packages" >&2
exit 1
