#!/usr/bin/env bash
# Installs everything qvl needs to build and test, from Debian's packages only.
# Idempotent: packages already present are skipped by apt. Runs apt-get update first.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl
  libcpp-httplib-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libjpeg62-turbo-dev libpng-dev libwebp-dev libcli11-dev libfmt-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  nodejs npm
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# nodejs/npm may come from elsewhere on the machine; only install them when absent.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do case "$p" in nodejs|npm) ;; *) filtered+=("$p");; esac; done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "deps: all Debian packages present"
fi
