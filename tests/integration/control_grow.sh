#!/bin/sh
# control_grow.sh: an elastic job grows when a worker joins, and a kill -9 of the coordinator
# during a membership change loses nothing. Three workers and a {min: 2, max: 3} job:
#  1. kill -9 of a member's worker (wc): the job goes on with the two others (incarnation 2);
#  2. a fourth worker (wd) registers: at the job's next checkpoint incarnation 2 ends ("worker
#     wd joined: growing at step N; resized 2 -> 3") and incarnation 3 runs on three workers
#     from that checkpoint, no committed step lost; the time from the registration to the
#     first step of incarnation 3 is printed, and must be under 10 s;
#  3. kill -9 of a member's worker (wb) and of the coordinator at once: the restarted one finds
#     wb lost and re-forms the job on wa, wd (incarnation 4);
#  4. a fifth worker (we) registers, and the coordinator is killed (-9) as soon as its log says
#     it ended incarnation 4 to grow, before the ranks of 4 have ended and 5 is placed: the
#     restarted one fences those ranks and places incarnation 5 on wa, wd, we itself.
# The job succeeds: 5 incarnations (see below for stalls), every loss step stored once, no
# restart charged to it.
# Exit 77 (skip) without Open MPI's mpirun.
. "$(dirname "$0")/lib/control.sh"
# the membership changes take about 20 s, some 60 steps on a loaded 2-core machine and a few
# hundred on an idle one; the rest of the steps take 2-3 minutes when loaded
STEPS=${GROW_STEPS:-600}
elastic_start grow "$STEPS" 10
# inc_world K: incarnation K (1-based) exists with at least 2 ranks
inc_world() { [ "$(inc_field "$1" '.world // 0')" -ge 2 ]; }
# restarted_places K MEMBERS: start the coordinator again on its state directory; incarnation
# K runs on MEMBERS (a JSON array), placed by the restarted coordinator
restarted_places() { # INCARNATION MEMBERS [ALSO: a jq test of $i that is accepted too]
    t_restart=$(date +%s.%N)
    start_coord
    ok "coordinator restarted on $HTTP_ADDR"
    check "incarnation $1 runs" wait_until 30 inc_world "$1"
    check "... placed by the restarted coordinator" \
        [ "$(echo "$(iso_epoch "$(inc_field "$1" .started_at)") > $t_restart" | bc -l)" -eq 1 ]
    check "... on $2${3:+ (or: $3)}" jq -e -n --argjson i "$(inc_field "$1" .)" --argjson m "$2" \
        "\$i.members == \$m ${3:+or ($3)}"
}
# newest_ckpt: the step of the newest checkpoint indexed (0 if none)
newest_ckpt() { api GET "/api/v1/jobs/$JOB/checkpoints" | jq '[.checkpoints[].step] | max // 0'; }

# 1. shrink: kill -9 of wc (rank 2)
check "incarnation 1 made a checkpoint" wait_until 60 ckpt_after 0
kill -9 "$WORKER_PID_wc"
ok "worker wc killed with SIGKILL at step $(job_step "$JOB")"
check "incarnation 2 runs on wa, wb" wait_until 30 inc_world 2
check "... and says so" sh -c "[ '$(inc_field 2 '.members | join(",")')' = wa,wb ]"
check "incarnation 1 ended: worker lost, resized 3 -> 2" jq -e -n \
    --argjson i "$(inc_field 1 .)" '$i.ended == "requeued" and $i.infra
    and ($i.reason | test("^worker lost: wc at step [0-9]+; resized 3 -> 2$"))'
check "incarnation 2 made a checkpoint" wait_until 60 ckpt_after "$(inc_field 2 .start_step)"

# 2. grow: a fourth worker registers
committed=$(newest_ckpt)
start_worker wd
t_reg=$(iso_epoch "$(grep "worker 'wd' registered" "$T/coordinator.log" | tail -n 1 | cut -c1-24)")
if wait_until 30 inc_world 3; then
    t_place=$(iso_epoch "$(inc_field 3 .started_at)")
    from=$(inc_field 3 .start_step)
    ok "incarnation 3 ($(inc_field 3 '.members | join(" ")')) placed $(secs "$t_reg" "$t_place") s after wd registered, from step $from (newest checkpoint at the registration: $committed)"
    # incarnation 2 may have reported that step before it ended: the new one's is after t_place
    if wait_until 60 step_after $((from + 1)) "$t_place"; then
        t_step=$(step_time $((from + 1)))
        GROW_S=$(secs "$t_reg" "$t_step")
        ok "incarnation 3 completed step $((from + 1)) $GROW_S s after wd registered"
        check "the job grew within 10 s of the registration" [ "$(echo "$GROW_S < 10" | bc -l)" -eq 1 ]
    else
        fail "incarnation 3 completed no step within 60 s"
    fi
else
    fail "the job did not grow within 30 s of wd's registration"
fi
check "incarnation 3 runs on 3 workers, wd among them" jq -e -n --argjson i "$(inc_field 3 .)" '
    $i.world == 3 and ($i.members | index("wd")) != null'
check "incarnation 2 ended at a checkpoint: \"worker wd joined: growing at step N; resized 2 -> 3\"" \
    jq -e -n --argjson i "$(inc_field 2 .)" '$i.ended == "requeued" and $i.infra
    and ($i.reason | test("^worker wd joined: growing at step [0-9]+; resized 2 -> 3$"))'
check "no committed step lost: incarnation 3 resumed from a checkpoint at or after step $committed" \
    jq -e -n --argjson i "$(inc_field 3 .)" --argjson c "$committed" '$i.start_step >= $c and $i.start_step > 0'
echo "     steps redone by the grow: $(( $(inc_field 2 '.reason | capture("at step (?<s>[0-9]+)").s') - $(inc_field 3 .start_step) ))"

# the window a restart can fall into: from the end of incarnation 2 to the placement of 3
t_end=$(iso_epoch "$(grep -F "job $JOB attempt 2: worker wd joined: growing 2 -> 3 at checkpoint" "$T/coordinator.log" | tail -n 1 | cut -c1-24)")
t_placed=$(iso_epoch "$(grep -F "job $JOB attempt 3 placed" "$T/coordinator.log" | tail -n 1 | cut -c1-24)")
ok "incarnation 2 ended at its checkpoint $(secs "$t_reg" "$t_end") s after wd registered; incarnation 3 placed $(secs "$t_end" "$t_placed") s later (the ranks of 2 ending)"

# 3. kill -9 of a member's worker and of the coordinator at once: the restarted coordinator
# finds wb lost (a full worker timeout after the restart) and re-forms the job
check "incarnation 3 made a checkpoint" wait_until 60 ckpt_after "$(inc_field 3 .start_step)"
at=$(job_step "$JOB")
kill -9 "$WORKER_PID_wb" "$COORD_PID"
wait "$COORD_PID" 2>/dev/null # gone, and its state lock with it, before the next one starts
ok "worker wb and the coordinator killed with SIGKILL at step $at"
restarted_places 4 '["wa","wd"]'
check "incarnation 3 ended: worker lost: wb" jq -e -n --argjson i "$(inc_field 3 .)" '
    $i.ended == "requeued" and ($i.reason | test("^worker lost: wb at step [0-9]+; resized 3 -> 2$"))'

# 4. kill -9 of the coordinator in the middle of a grow: a fifth worker registers; as soon as
# the coordinator has ended incarnation 4 at its checkpoint (its log says so), before the
# ranks of incarnation 4 have ended and incarnation 5 is placed, it is killed
check "incarnation 4 made a checkpoint" wait_until 60 ckpt_after "$(inc_field 4 .start_step)"
start_worker we
if wait_until 30 grep -qF "job $JOB attempt 4: worker we joined: growing 2 -> 3 at checkpoint" "$T/coordinator.log"; then
    kill -9 "$COORD_PID"
    wait "$COORD_PID" 2>/dev/null
    ok "coordinator killed with SIGKILL as soon as it had ended incarnation 4 to grow"
else
    fail "the coordinator did not grow the job within 30 s of we's registration"
fi
check "... before it placed incarnation 5" sh -c "! grep -q 'job $JOB attempt 5 placed' '$T/coordinator.log'"
ok "ranks of incarnation 4 still running at the kill: $(rank_cmdlines "/job-$JOB/attempt-4/" | wc -l)"
# a restarted coordinator places on the workers heard from since it started: when we's first
# heartbeat comes after wa's and wd's (a slow machine), incarnation 5 starts on those two and
# grows to we at its next checkpoint, which is just as right
restarted_places 5 '["wa","wd","we"]' '$i.members == ["wa","wd"]'
check "the job succeeds" wait_until 400 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
# 3 MPI ranks of workers on a loaded 2-core machine have stalled for good now and then (in 3
# of 6 runs here; not seen in a standalone 3-rank mpirun): the watchdog re-forms the job
# then, and this test lets such re-forms after incarnation 5 pass, and says so
check "incarnations 3, 2, 3, 2, 3 ranks (or 3, 2, 3, 2, 2, 3: grown to we after the restart), no restart charged to the job" jq -e '
    .restarts == 0 and (([.incarnations[:5][].world] == [3, 2, 3, 2, 3]
            and (.incarnations[3].reason | test("^worker we joined: growing at step [0-9]+; resized 2 -> 3$")))
        or ([.incarnations[:6][].world] == [3, 2, 3, 2, 2, 3]
            and (.incarnations[3].reason | test("^worker we joined: growing at step [0-9]+$"))
            and (.incarnations[4].reason | test("^worker we (free|joined): growing at step [0-9]+; resized 2 -> 3$"))))
    and all(.incarnations[4:-1][]; .reason | test("^no progress for |: growing at step "))
    and .incarnations[-1].ended == "succeeded"' "$T/job.json"
n=$(jq '.incarnations | length' "$T/job.json")
[ "$n" -gt 5 ] && echo "     note: $((n - 5)) watchdog re-form(s) or grow(s) after incarnation 5: $(jq -c '[.incarnations[4:-1][].reason]' "$T/job.json")"
check "the result counts every step" jq -e --argjson n "$STEPS" '.result.steps == $n' "$T/job.json"
check "loss steps 1..$STEPS are all stored once" loss_steps_exact "$JOB" "$STEPS"
check "no log line stored twice" sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB/logs?tail=100000' |
    jq -e '[.lines[] | [.attempt, .rank, .seq]] | (length == (unique | length))' >/dev/null"
"$BIN/mgectl" get "$JOB" >"$T/get.txt"
check "mgectl get shows the grow" grep -Eq '^    2 +\["wa","wb"\] from step [0-9]+: requeued: worker wd joined: growing at step [0-9]+; resized 2 -> 3$' "$T/get.txt"
[ -n "$GROW_S" ] && echo "     grow: wd's registration -> first step of incarnation 3: $GROW_S s"
finish
