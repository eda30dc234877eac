#!/usr/bin/env bash
# The conformance suite's long profile: about an hour of random draws (new seeds until
# the time is spent), every mode including Ray where it is installed, with a log.
#
#   tests/conformance/run_long.sh [LOG] [MINUTES]
#
# LOG defaults to conformance-long-<UTC time>.log here, MINUTES to 60. Each round is one
# pytest run of tests/conformance in the long profile with its own --hypothesis-seed; the
# log keeps every round's output and, at the end, the coverage table of all rounds.
# Exit status: 0 if every round passed, 1 otherwise (a failing round's output names the
# falsifying case: add it to known_defects.py, or as an @example once fixed).
set -uo pipefail
cd "$(dirname "$0")/../.."
LOG="${1:-conformance-long-$(date -u +%Y%m%dT%H%M%SZ).log}"
MINUTES="${2:-60}"
PY="${PYTHON:-python}"
CASES="$(mktemp)"
trap 'rm -f "$CASES"' EXIT
end=$(( $(date +%s) + MINUTES * 60 ))
seed="${CHUTE_CONFORMANCE_SEED:-$(date +%s)}"
status=0
exec > >(tee "$LOG") 2>&1
echo "conformance long run: $(date -u), $(git rev-parse HEAD 2>/dev/null), $MINUTES min"
while [ "$(date +%s)" -lt "$end" ]; do
  echo "== round seed=$seed $(date -u +%H:%M:%S)"
  if ! CHUTE_CONFORMANCE=long CHUTE_CONFORMANCE_LOG="$CASES" PYTHONPATH="$PWD/src:$PWD/tests:${PYTHONPATH:-}" \
    timeout 1800 "$PY" -m pytest -p no:cacheprovider -q -m "slow or not slow" \
    --hypothesis-seed="$seed" --hypothesis-show-statistics tests/conformance; then
    status=1
  fi
  seed=$((seed + 1))
done
echo "== coverage of all rounds"
PYTHONPATH="$PWD/src:$PWD/tests" "$PY" -m conformance.coverage "$CASES"
echo "== end $(date -u), status $status"
exit "$status"
