#!/usr/bin/env bash
# Make sure a Vulkan driver exists so wgpu does not fall back to OpenGL (no f16, no subgroups).
# Installs Debian's mesa-vulkan-drivers (lavapipe) when no Vulkan ICD is present and we are root.
set -euo pipefail
have_icd() { ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null | grep -q . && ldconfig -p | grep -q 'libvulkan.so.1'; }
if have_icd; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "labkit: no Vulkan driver found; installing Debian's mesa-vulkan-drivers (lavapipe)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
  have_icd && exit 0
fi
echo "labkit: error: no Vulkan driver. Install Debian's mesa-vulkan-drivers and libvulkan1 (sudo apt-get install mesa-vulkan-drivers libvulkan1), or a GPU driver." >&2
exit 1
