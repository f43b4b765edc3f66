#!/usr/bin/env bash
# Installs the Debian packages remat's build, tests and examples need, if any is missing.
set -euo pipefail
packages=(cmake g++ make python3 libeigen3-dev libopenblas-dev libopenblas-openmp-dev libdnnl-dev libgtest-dev libbenchmark-dev zlib1g-dev libcli11-dev nlohmann-json3-dev doxygen
          libopenmpi-dev openmpi-bin
          dataset-fashion-mnist fortunes)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
