#!/bin/sh
# install-deps.sh: install the Debian packages mge needs to build, test and demo, if missing.
# Idempotent and quiet when everything is present. Needs root (or sudo) only when it installs.
set -e
PKGS="build-essential pkg-config clang libclang-rt-14-dev check libyaml-dev libjansson-dev
zlib1g-dev libprotobuf-c-dev protobuf-c-compiler libopenblas-dev libdnnl-dev libnng-dev
libmicrohttpd-dev libgnutls28-dev openssl libuv1-dev libsqlite3-dev libcurl4-openssl-dev libssl-dev libopenmpi-dev openmpi-bin
iproute2 dataset-fashion-mnist fortunes-min python3 curl jq python3-yaml chromium systemd python3-kubernetes ${MGE_EXTRA_PKGS:-}"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# node and npm may come from another packaging of Node.js (nodesource's nodejs ships npm):
# ask Debian for them only when the commands are missing
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
# kubectl (deploy/k8s checks): Debian's kubernetes-client, unless another kubectl is there
command -v kubectl >/dev/null 2>&1 || missing="$missing kubernetes-client"
[ -z "$missing" ] && exit 0
echo "install-deps: installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
echo "install-deps: done"
