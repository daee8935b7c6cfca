#!/usr/bin/env bash
# Fuzz smoke run: builds every cargo-fuzz target and runs each for SECONDS
# (default 20) from the committed corpus; exits non-zero if any target finds
# a crash, a hang (an input taking more than 10 s) or runs out of memory.
# Crashing inputs are left in fuzz/artifacts/<target>/.
#
# The targets need the nightly-only sanitizer flags, and only a stable
# toolchain is installed: RUSTC_BOOTSTRAP=1 lets stable rustc take them
# (see docs/fuzzing.md).
set -euo pipefail

seconds="${1:-20}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 1 || seconds > 86400)); then
    echo "usage: fuzz/smoke.sh SECONDS (1 to 86400 per target)" >&2
    exit 2
fi
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
export RUSTC_BOOTSTRAP=1

# New inputs go to a scratch corpus, never into the committed one; the
# receive_stream target keeps its consumer file under TMPDIR.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/tmp"

cargo fuzz build
mapfile -t targets < <(cargo fuzz list)
if ((${#targets[@]} == 0)); then
    echo "no fuzz targets found" >&2
    exit 1
fi

failed=()
for target in "${targets[@]}"; do
    echo "== fuzz $target for ${seconds}s"
    mkdir -p "$work/corpus/$target"
    # libFuzzer reports every new input; keep its log, print its summary,
    # and the whole log when the target fails.
    log="$work/$target.log"
    if TMPDIR="$work/tmp" cargo fuzz run "$target" "$work/corpus/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" || true
    else
        cat "$log"
        failed+=("$target")
    fi
done

if ((${#failed[@]} > 0)); then
    echo "fuzz smoke failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz smoke passed: ${targets[*]}, ${seconds}s each"
