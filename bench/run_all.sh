#!/usr/bin/env bash
# One run of every benchmark bench/README.md's figures table quotes, one after another (never two at once:
# they would time each other), each one's output whole in a log with the date, the commit and
# the machine's load beside it. That table is regenerated from one such log.
#
#     bench/run_all.sh [--base DIR] [LOG]   # default bench-all-<date>.log; ~30 min on 2 cores
#     SOAK_FAULTS=40 bench/run_all.sh       # the long soak (default 12 faults here)
#
# --base DIR (a worktree of another revision: `git worktree add /tmp/base9c 9c82496`): each
# script then runs under this tree and, right after it, the same script of DIR with the same
# arguments and this venv (DIR first on PYTHONPATH), both outputs in the log, labelled; the
# scripts that compare two trees themselves (profile_checks.py, bench_replicas.py,
# bench_lr_probe_speed.py, bench_checks_base.py, bench_instructions.py) print the ratios. About
# 75 min on a quiet 2-core host. A script the base tree lacks runs under this tree only.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
base=""
if [[ "${1:-}" == "--base" ]]; then
  base=$(cd "$2" && pwd)
  shift 2
fi
log=${1:-bench-all-$(date -u +%Y%m%dT%H%MZ).log}
[[ "$log" == /* ]] || log=$here/$log  # the base's runs write to it from DIR
py=.venv/bin/python
{
  echo "# bench/run_all.sh  $(date -u +%Y-%m-%dT%H:%MZ)  commit $(git rev-parse --short HEAD)${base:+  base $base at $(git -C "$base" rev-parse --short HEAD)}"
  echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$log"
once() {
  local label=$1
  shift
  echo "## $label: $*  (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"
  local start=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  echo "## $label took $((SECONDS - start)) s" | tee -a "$log"
}
run() {
  once this "$py" "$@"
  if [[ -n "$base" && -f "$base/$1" ]]; then
    (cd "$base" && PYTHONPATH="$base" once base "$here/$py" "$@")
  fi
}
run bench/bench_core.py
run bench/bench_http.py
run bench/bench_scaling.py --quick
run bench/bench_refusals.py --repeats 9
run bench/bench_checks.py
run bench/bench_resume_check.py
run bench/bench_packed_check.py
run bench/bench_stream_check.py --runs 3
run bench/bench_load.py
run bench/bench_models.py
run bench/bench_throughput.py
run bench/bench_polling.py --rounds 4
run bench/bench_mixed_curves.py
run bench/bench_lr_scaling.py
run bench/bench_lr_truth.py
run bench/bench_probe_lane.py
run bench/bench_soak.py --faults "${SOAK_FAULTS:-12}"
if [[ -n "$base" ]]; then
  # Both trees in one script, with the ratios.
  once both "$py" bench/bench_replicas.py --base "$base"
  once both "$py" bench/profile_checks.py --base "$base" --rounds 3 --runs 3
  once both "$py" bench/bench_lr_probe_speed.py --base "$base" --rounds 2 --runs 3
  once both "$py" bench/bench_checks_base.py --base "$base" --rounds 3
  once both "$py" bench/bench_instructions.py --base "$(git -C "$base" rev-parse HEAD)" --stages all
else
  once this "$py" bench/bench_replicas.py
fi
echo "# done $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$log"
