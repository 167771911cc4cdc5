#!/usr/bin/env bash
# Installs what tests/report.rs needs and prints, on its last line, the Python that has
# Playwright: Debian's chromium (driven as a system browser, nothing downloaded by
# Playwright), a CJK font for the articles' sentences, and a venv with Playwright.
#   bash tools/browser/setup.sh [VENV_DIR]   (default: .venv-browser at the repo root)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${1:-$root/.venv-browser}"

if ! command -v chromium >/dev/null || ! fc-list 2>/dev/null | grep -qi "wenquanyi\|noto sans cjk"; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "setup.sh: need root or sudo to apt-get install chromium" >&2; exit 1; }
        sudo="sudo"
    fi
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium fonts-wqy-zenhei >&2
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import playwright" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q -r "$root/tools/browser/requirements.txt" >&2
fi
echo "$venv/bin/python"
