#!/usr/bin/env bash
# Runs Sluice's fuzz targets (cargo-fuzz, libFuzzer) on the stable toolchain.
#
#   fuzz/run.sh smoke [TARGET...]   a fixed number of runs per target from a fixed seed (make fuzz-smoke,
#                                   part of make test): deterministic, about 10 s a target
#   fuzz/run.sh long  [TARGET...]   FUZZ_SECONDS (default 600) per target, random seeds (make fuzz)
#
# The sanitizers need nightly-only rustc flags, so the targets are built without one (--sanitizer none):
# the stable compiler then takes every flag cargo-fuzz passes (coverage instrumentation, debug assertions,
# overflow checks), and Rust's own checks (bounds, overflow, the targets' assertions) find the bugs.
# Each run starts from the committed seeds in fuzz/corpus/<target>; what it finds goes to
# fuzz/target/corpus/<target> (kept between long runs, not committed; a smoke run starts it empty). A
# crash leaves its input in fuzz/artifacts/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")"

mode=${1:-smoke}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(http_head chunked sidecar_config annotations)

# Runs per target in smoke mode: about ten seconds each on a loaded two-core machine.
declare -A SMOKE_RUNS=([http_head]=1000000 [chunked]=200000 [sidecar_config]=10000 [annotations]=40000)

# The lock file is committed and must not change (cargo fuzz has no --locked of its own).
cargo metadata --locked --format-version 1 >/dev/null
# One build of every target (they share all their dependencies).
nice -n 10 cargo fuzz build --sanitizer none --codegen-units 16

status=0
for t in "${targets[@]}"; do
  case $mode in
    smoke) args=(-seed=1 "-runs=${SMOKE_RUNS[$t]}" -max_total_time=60) ;;
    long) args=("-max_total_time=${FUZZ_SECONDS:-600}") ;;
    *) echo "usage: fuzz/run.sh smoke|long [TARGET...]" >&2; exit 2 ;;
  esac
  [ "$mode" = long ] || rm -rf "target/corpus/$t"
  mkdir -p "target/corpus/$t" "artifacts/$t"
  echo "fuzz: $t ($mode: ${args[*]})"
  start=$(date +%s)
  if ! cargo fuzz run --sanitizer none --codegen-units 16 "$t" "target/corpus/$t" "corpus/$t" -- \
      "${args[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      > "target/$t.log" 2>&1; then
    tail -n 40 "target/$t.log" >&2
    echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/ (reproduce: cargo fuzz run --sanitizer none $t fuzz/artifacts/$t/<file>)" >&2
    status=1
    continue
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "target/$t.log" | tail -1)
  echo "fuzz: $t passed: ${runs:-?} inputs in $(( $(date +%s) - start )) s"
done
exit $status
