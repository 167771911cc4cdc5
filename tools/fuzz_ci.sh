#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ on the reproducers of crashes found before
# (fuzz/regressions/<target>/), then briefly on its committed corpus, and fails on any
# crash, out-of-memory or slow input. Usage: bash tools/fuzz_ci.sh [SECONDS_PER_TARGET]
# (default 30; also QKV_FUZZ_SECONDS). See fuzz/README.md.
#
# Works on the stable toolchain: cargo-fuzz passes nightly-only flags (-Zsanitizer=address
# among them), which RUSTC_BOOTSTRAP=1 lets stable rustc accept; stable ships the ASan
# runtime. The committed corpus is only read: what the run finds goes to a temporary
# folder, and a failing input is saved under fuzz/artifacts/<target>/ (ignored by git),
# with the command that reproduces it printed.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-${QKV_FUZZ_SECONDS:-30}}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
# release build with debug assertions and overflow checks, AddressSanitizer (the default)
build_flags=(--fuzz-dir fuzz -O -a --codegen-units 16)
# out-of-memory and slow inputs are failures too
limits=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10)

cargo fuzz build "${build_flags[@]}"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=()
for target in $(cargo fuzz list --fuzz-dir fuzz); do
    echo "== fuzz target ${target}: ${seconds} s on fuzz/corpus/${target}" >&2
    mkdir -p "$scratch/$target"
    # every crash found before must stay fixed: its reproducers run once each
    if [[ -d "fuzz/regressions/$target" ]]; then
        if ! cargo fuzz run "${build_flags[@]}" "$target" fuzz/regressions/"$target"/* -- \
            "${limits[@]}"; then
            failed+=("$target (fuzz/regressions/$target)")
            continue
        fi
    fi
    # the first folder receives new inputs; the committed corpus is read only
    if ! cargo fuzz run "${build_flags[@]}" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1; then
        failed+=("$target")
    fi
done

if ((${#failed[@]})); then
    echo "fuzz targets that failed: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "all fuzz targets ran ${seconds} s without a failure" >&2
