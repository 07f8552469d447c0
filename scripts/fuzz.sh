#!/usr/bin/env bash
# Fuzzing: `scripts/fuzz.sh [seconds] [target...]` runs each cargo-fuzz target in fuzz/ (all of
# them by default) for that many seconds (default 60) on its corpus (fuzz/corpus/<target>, grown
# from the committed seeds in fuzz/seeds/<target>), then prints how many executions each
# reached. A crash, panic, abort or hang fails the run; libFuzzer saves the input in
# fuzz/artifacts/<target>/ (turn it into a unit test of the parser).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
shift || true

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build

status=0
summary=""
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t"
    log=$(mktemp)
    echo "== $t (${seconds} s)"
    if ! cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=1
        tail -n 40 "$log"
        summary+=$(printf '%-20s FAILED (see fuzz/artifacts/%s)' "$t" "$t")$'\n'
    else
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
        summary+=$(printf '%-20s %12s executions in %s s (%s/s)' "$t" "$execs" "$seconds" "$rate")$'\n'
    fi
    rm -f "$log"
done
printf '\n%s' "$summary"
exit "$status"
