#!/bin/sh
# control_gpt.sh: a GPT trained as a service job. The same small GPT on the text of Debian's
# fortunes-min, submitted with mgectl once on 1 worker and once on 2 (one mpirun, rank 1
# started through the other worker's launch socket, the batch split between the ranks): the
# 2-worker job's loss at every step matches the 1-worker job's (1e-5 relative), and both report
# the held-out loss and tokens/s. Skips without fortunes-min or Open MPI.
. "$(dirname "$0")/lib/control.sh"
F=/usr/share/games/fortunes
[ -f $F/fortunes ] && [ -f $F/literature ] ||
    { echo "SKIP: fortunes-min is not installed (deploy/install-deps.sh installs it)"; exit 77; }
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
[ -n "$MPIRUN" ] || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
[ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }

STEPS=30
start_coord
start_worker wa --data-root "$F"
start_worker wb --data-root "$F"
spec() { # NAME WORKERS
    cat <<Y
name: $1
model: {type: gpt, layers: 2, heads: 2, d_model: 32, context: 32, vocab: 256}
data: {format: text, train_files: [$F/fortunes, $F/literature]}
resources: {workers: $2, cpus: 1}
train:
  steps: $STEPS
  batch_size: 8
  optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1}
  lr_schedule: {type: cosine, warmup_steps: 5}
  clip_grad_norm: 1.0
  seed: 7
  log_every: 1
Y
}
spec gpt-one 1 >"$T/one.yaml"
spec gpt-two 2 >"$T/two.yaml"
ONE=$("$BIN/mgectl" submit "$T/one.yaml" -o json | jq -r .id)
TWO=$("$BIN/mgectl" submit "$T/two.yaml" -o json | jq -r .id)
check "the 1-worker GPT job succeeds" wait_until 120 state_is "$ONE" succeeded
check "the 2-worker GPT job succeeds" wait_until 120 state_is "$TWO" succeeded
api GET "/api/v1/jobs/$ONE" >"$T/one.json"
api GET "/api/v1/jobs/$TWO" >"$T/two.json"
check "2 ranks on 2 workers in one MPI job" jq -e '.result.ranks == 2 and
    ([.placement[].worker] | unique | length) == 2' "$T/two.json"
check "both report the held-out loss and tokens/s" jq -e -n --slurpfile a "$T/one.json" \
    --slurpfile b "$T/two.json" '[$a[0], $b[0]] | all(.result.test_loss > 0 and
    .result.test_loss < 6 and .result.tokens_per_sec > 0)'
api GET "/api/v1/jobs/$ONE/metrics?name=loss" >"$T/one-loss.json"
api GET "/api/v1/jobs/$TWO/metrics?name=loss" >"$T/two-loss.json"
worst=$(jq -n -r --slurpfile a "$T/one-loss.json" --slurpfile b "$T/two-loss.json" '
    [$a[0].metrics[] | {(.step | tostring): .value}] | add as $x
    | [$b[0].metrics[] | {(.step | tostring): .value}] | add as $y
    | if ($x | length) != '"$STEPS"' or ($y | length) != '"$STEPS"' then "missing"
      else [$x | keys[] | (($x[.] - $y[.]) | fabs) / ($x[.] | fabs)] | max end')
echo "     loss at steps 1 and $STEPS: 1 worker $(jq -r '.metrics[0].value, .metrics[-1].value' "$T/one-loss.json" | paste -sd' '), 2 workers $(jq -r '.metrics[0].value, .metrics[-1].value' "$T/two-loss.json" | paste -sd' ')"
check "the 2-worker loss curve matches the 1-worker one at all $STEPS steps (worst relative $worst <= 1e-5)" \
    awk "BEGIN { exit !(\"$worst\" != \"missing\" && $worst + 0 <= 1e-5) }"
check "... and falls (first vs last loss)" jq -e '.metrics[-1].value < .metrics[0].value - 0.5' \
    "$T/two-loss.json"
finish
