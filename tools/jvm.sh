#!/usr/bin/env bash
# Installs a Java runtime from the system's packages (OpenJDK 17, headless), if there is
# no `java`, for the test that runs docs/scale.md's Spark recipe on a local Spark, and
# prints the java path on the last line.
#   bash tools/jvm.sh
set -euo pipefail
if ! command -v java >/dev/null; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "jvm.sh: need root or sudo to apt-get install a JRE" >&2; exit 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >&2
fi
command -v java
