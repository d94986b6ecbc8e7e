#!/usr/bin/env bash
# One run of every benchmark bench/README.md's figures table quotes, one after another (never two at once:
# they would time each other), each one's output whole in a log with the date, the commit and
# the machine's load beside it. That table is regenerated from one such log.
#
#     bench/run_all.sh [LOG]        # default bench-all-<date>.log; ~25 min on 2 cores
#     SOAK_FAULTS=40 bench/run_all.sh   # the long soak (default 12 faults here)
set -euo pipefail
cd "$(dirname "$0")/.."
log=${1:-bench-all-$(date -u +%Y%m%dT%H%MZ).log}
py=.venv/bin/python
{
  echo "# bench/run_all.sh  $(date -u +%Y-%m-%dT%H:%MZ)  commit $(git rev-parse --short HEAD)"
  echo "# $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$log"
run() {
  echo "## $*  (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$log"
  local start=$SECONDS
  "$py" "$@" 2>&1 | tee -a "$log"
  echo "## took $((SECONDS - start)) s" | tee -a "$log"
}
run bench/bench_core.py
run bench/bench_http.py
run bench/bench_scaling.py --quick
run bench/bench_refusals.py --repeats 9
run bench/bench_checks.py
run bench/bench_resume_check.py
run bench/bench_packed_check.py
run bench/bench_load.py
run bench/bench_models.py
run bench/bench_throughput.py
run bench/bench_mixed_curves.py
run bench/bench_lr_scaling.py
run bench/bench_probe_lane.py
run bench/bench_soak.py --faults "${SOAK_FAULTS:-12}"
echo "# done $(date -u +%Y-%m-%dT%H:%MZ)" | tee -a "$log"
