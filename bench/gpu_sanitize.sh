#!/usr/bin/env bash
# Sourced by the GPU scripts after bench/gpu_build.sh: `sanitize [selftest args]` runs
# the selftest of $HOST with $LIB under compute-sanitizer's memcheck and racecheck
# (outputs in $out/memcheck.txt and $out/racecheck.txt), prints each one's summary,
# and sets rc=1 where memcheck finds more than the selftest's deliberate API errors
# (its out-of-memory case makes cudaMalloc fail on purpose: those are listed, not
# memory errors) or racecheck any hazard. Without compute-sanitizer it says so.
sanitize() {
  if ! command -v compute-sanitizer >/dev/null; then
    echo "sanitizers: compute-sanitizer not found, not run"
    return
  fi
  compute-sanitizer --tool memcheck --leak-check full "$HOST" --backend "$LIB" --selftest "$@" \
    > "$out/memcheck.txt" 2>&1
  local errors api summary
  errors=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$out/memcheck.txt" | grep -o '[0-9]*')
  api=$(grep -c 'Program hit' "$out/memcheck.txt")
  echo "memcheck: ${errors:-no summary} error(s), $api of them the deliberate API errors"
  [[ -n $errors && $errors == "$api" ]] || rc=1
  compute-sanitizer --tool racecheck "$HOST" --backend "$LIB" --selftest "$@" > "$out/racecheck.txt" 2>&1
  summary=$(grep -m1 'RACECHECK SUMMARY' "$out/racecheck.txt")
  echo "racecheck: ${summary:-no summary}"
  [[ $summary == *": 0 hazards displayed (0 errors, 0 warnings)"* ]] || rc=1
}
