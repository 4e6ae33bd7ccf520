# Step runner of the GPU check scripts (sourced by scripts/gpu_checks.sh and gpu_numerics.sh).
# Needs OUT (a folder), SUMMARY (a file in it) and STEPS_NAME (the script's name) set, and
# FAILED=0; `log TEXT` prints and appends a timestamped line to SUMMARY; `step NAME TIMEOUT_S
# CMD...` runs CMD with its output in $OUT/NAME.log and records PASS or FAIL (then FAILED=1).
log() { echo "[$STEPS_NAME $(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    log "PASS $name ($((SECONDS - t0)) s)"
  else
    [ $rc -eq 124 ] && echo "$STEPS_NAME: timed out after $limit s" >>"$OUT/$name.log"
    log "FAIL $name (exit $rc, $((SECONDS - t0)) s; see $name.log)"
    tail -n 30 "$OUT/$name.log" | sed 's/^/    /'
    FAILED=1
  fi
  return $rc
}
