#!/usr/bin/env bash
# Installs nginx from the system's packages, if missing, for the test that runs three
# `qkv serve` replicas behind deploy/nginx/qkv.conf, and prints its path on the last line.
#   bash tools/nginx.sh
set -euo pipefail
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "nginx.sh: need root or sudo to apt-get install nginx" >&2; exit 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends nginx-light >&2 \
        || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends nginx >&2
fi
command -v nginx 2>/dev/null || echo /usr/sbin/nginx
