#!/bin/sh
# cli.sh: mgectl as a user meets it: the live progress line under a pseudo-terminal and the
# plain lines when piped, each documented exit code, config.yaml (precedence and errors that
# name the file, key and line), and shell completion.
. "$(dirname "$0")/lib/control.sh"
command -v script >/dev/null 2>&1 || { echo "SKIP: script (util-linux) not installed"; exit 77; }
M=$BIN/mgectl
# mgectl here must not read the user's own config
export XDG_CONFIG_HOME="$T/xdg" HOME="$T/home"
unset MGE_PROGRESS_EVERY MGE_CONFIG MGE_TOKEN_FILE MGE_CACERT
mkdir -p "$T/xdg/mge" "$T/home"

start_coord
start_worker w1
# 400 steps of the LONG model: 2-10 s, long enough for several progress intervals
cat > "$T/long.yaml" <<Y
name: long
$LONG_MODEL
$LONG_DATA
train:
  steps: 400
  batch_size: 128
  $LONG_OPT
Y
cat > "$T/fail.yaml" <<Y
name: doomed
$QUICK_MODEL
data: {format: idx, train_images: /nonexistent/x.gz, train_labels: /nonexistent/y.gz}
train: {steps: 5, batch_size: 32, $QUICK_OPT}
Y

# --- piped: a plain line every --every seconds, the last step, and the summary
t0=$(date +%s)
"$M" submit "$T/long.yaml" -f --every 1 >"$T/piped.out" 2>"$T/piped.err"; rc=$?
secs=$(( $(date +%s) - t0 + 1 ))
JOB=$(sed -n 's/^job \([0-9]*\) submitted.*/\1/p' "$T/piped.out")
check "piped: submit -f exits 0 for a job that succeeds" [ "$rc" = 0 ]
n=$(grep -c '^step ' "$T/piped.out")
check "piped: $n step lines for 400 steps in ${secs} s at --every 1 (at most one a second)" \
    sh -c "[ $n -ge 2 ] && [ $n -le $((secs + 2)) ]"
check "piped: the step line has loss, samples/s and ETA" \
    grep -Eq '^step [0-9]+/400 loss [0-9.]+ samples/s [0-9.]+ eta ' "$T/piped.out"
check "piped: the last step is always printed" grep -q '^step 400/400 .*eta done$' "$T/piped.out"
check "piped: no terminal control characters" sh -c "! grep -q \"$(printf '\r')\" '$T/piped.out' '$T/piped.err'"
check "piped: the summary names the state, steps, loss and accuracy" \
    grep -Eq "^job $JOB succeeded: step 400/400, loss [0-9.]+, test accuracy [0-9.]+%, ran [0-9]+" "$T/piped.err"
"$M" logs "$JOB" -f >"$T/default.out" 2>&1
check "piped: default interval 10 s: a replay of the finished job prints its first and last step" \
    sh -c "[ \$(grep -c '^step ' '$T/default.out') = 2 ]"

# --- a terminal: one progress line rewritten in place
script -qec "$M logs $JOB -f" /dev/null </dev/null >"$T/pty.out" 2>&1; rc=$?
check "pty: logs -f exits 0" [ "$rc" = 0 ]
CR=$(printf '\r')
check "pty: no step line ends with a newline (the line is rewritten)" \
    sh -c "! tr '$CR' '\n' <'$T/pty.out' | grep -q '^step '"
check "pty: the progress line is drawn (erase-line, bar, step/total, loss, samples/s, ETA)" \
    sh -c "tr '$CR' '\n' <'$T/pty.out' | grep -Eq \"^$(printf '\033')\\[K\\[[#.]{20}\\] step [0-9]+/400  loss [0-9.]+  [0-9]+ samples/s  ETA \""
check "pty: it reaches step 400/400" grep -q 'step 400/400' "$T/pty.out"
check "pty: the rank's log lines and the summary are lines of their own" \
    sh -c "tr -d '$CR' <'$T/pty.out' | grep -q 'mge-worker: rank 0: exited with code 0\$' &&
           grep -q \"job $JOB succeeded: step 400/400\" '$T/pty.out'"

# --- exit codes (documented in mgectl --help and docs/operations.md)
code() { "$@" >/dev/null 2>"$T/code.err"; echo $?; }
FAIL=$("$M" submit "$T/fail.yaml" -o json 2>/dev/null | jq -r .id)
check "exit 1: -f on a job that fails, with its reason" \
    sh -c "[ \$('$M' logs $FAIL -f >/dev/null 2>'$T/f.err'; echo \$?) = 1 ] &&
           grep -q '^job $FAIL failed: .' '$T/f.err'"
check "exit 2: unknown command, named" sh -c "[ $(code "$M" frobnicate) = 2 ] && grep -q \"unknown command 'frobnicate'\" '$T/code.err'"
check "exit 2: bad arguments" [ "$(code "$M" get notanid)" = 2 ]
check "exit 2: bad --every" [ "$(code "$M" logs 1 -f --every soon)" = 2 ]
check "exit 2: no such spec file" [ "$(code "$M" submit "$T/nonexistent.yaml")" = 2 ]
check "exit 3: server unreachable" sh -c "[ $(code "$M" --server http://127.0.0.1:1 list) = 3 ] && grep -q 'cannot reach' '$T/code.err'"
check "exit 4: token refused" [ "$(code "$M" --token wrong list)" = 4 ]
check "exit 4: read-only token on cancel" [ "$(code "$M" --token "$RO" cancel "$JOB")" = 4 ]
check "exit 5: no such job" [ "$(code "$M" get 999999)" = 5 ]
CAN=$("$M" submit "$T/long.yaml" -o json | jq -r .id)
wait_until 20 step_at_least "$CAN" 1
"$M" cancel "$CAN" >/dev/null
check "exit 6: -f on a cancelled job" [ "$(code "$M" logs "$CAN" -f)" = 6 ]
check "exit 0: a command that works" [ "$(code "$M" list)" = 0 ]

# --- config.yaml: below flags and environment; errors name the file, key and line
unset MGE_SERVER MGE_TOKEN
echo "$ADMIN" >"$T/xdg/mge/admin.token"
printf 'server: %s\ntoken_file: admin.token\n' "$URL" >"$T/xdg/mge/config.yaml"
check "config.yaml: server and token_file (relative to the file) are used" "$M" get "$JOB"
check "config.yaml: an environment token wins over it" \
    sh -c "[ \$(MGE_TOKEN=wrong '$M' list >/dev/null 2>&1; echo \$?) = 4 ]"
check "config.yaml: --server wins over it" [ "$(code "$M" --server http://127.0.0.1:1 list)" = 3 ]
echo "$RO" >"$T/ro.token"
check "config.yaml: --token-file wins over it" [ "$(code "$M" --token-file "$T/ro.token" cancel "$JOB")" = 4 ]
printf 'server: %s\nsever: x\n' "$URL" >"$T/xdg/mge/config.yaml"
check "config.yaml: an unknown key: exit 2 naming file, line and key" \
    sh -c "[ $(code "$M" list) = 2 ] && grep -q \"$T/xdg/mge/config.yaml:2: unknown key 'sever'\" '$T/code.err'"
printf 'server: %s\ntoken_file: [a, b]\n' "$URL" >"$T/xdg/mge/config.yaml"
check "config.yaml: a key that is not a string: exit 2 with its line" \
    sh -c "[ $(code "$M" list) = 2 ] && grep -q \"config.yaml:2: key 'token_file'\" '$T/code.err'"
printf 'server: "%s\n' "$URL" >"$T/xdg/mge/config.yaml"
check "config.yaml: not YAML: exit 2 naming the file" \
    sh -c "[ $(code "$M" list) = 2 ] && grep -q 'config.yaml:[0-9]*: not YAML' '$T/code.err'"
printf 'server: %s\ntoken_file: missing.token\n' "$URL" >"$T/xdg/mge/config.yaml"
check "config.yaml: a missing token file: exit 2 naming it and the key's line" \
    sh -c "[ $(code "$M" list) = 2 ] && grep -q \"missing.token' (.*config.yaml:2, key 'token_file')\" '$T/code.err'"
printf 'cacert: /nonexistent/ca.pem\n' >"$T/xdg/mge/config.yaml"
check "config.yaml: an unreadable cacert: exit 2" [ "$(code "$M" list)" = 2 ]
printf 'server: %s\ntoken_file: %s\n' "$URL" "$T/ro.token" >"$T/other.yaml"
check "MGE_CONFIG names another file" sh -c "MGE_CONFIG='$T/other.yaml' '$M' list >/dev/null"
rm -f "$T/xdg/mge/config.yaml"
check "no config file is no error (exit 3 from --server, not 2)" \
    sh -c "[ \$('$M' --server http://127.0.0.1:1 list >/dev/null 2>&1; echo \$?) = 3 ]"

mkdir -p "$T/home/.config/mge"
echo "server = $URL" >"$T/home/.config/mge/config"
check "the key = value file of earlier versions is named as no longer read" \
    sh -c "'$M' --server http://127.0.0.1:1 list 2>&1 | grep -q \"config' is no longer read\""

# --- top: workers and jobs on one screen; once when piped, redrawn on a terminal
"$M" --server "$URL" --token "$ADMIN" top >"$T/top.out" 2>&1; rc=$?
check "top piped: one screen, exit 0" [ "$rc" = 0 ]
check "top: the worker with its free/total slots" grep -Eq '^w1 +ready +[0-9]+/2 ' "$T/top.out"
check "top: the finished job with its state" grep -Eq "^$JOB +long +succeeded " "$T/top.out"
"$M" --server "$URL" --token "$ADMIN" submit "$T/long.yaml" >/dev/null 2>&1
script -qec "$M --server $URL --token $ADMIN top --every 0.5" /dev/null </dev/null >"$T/top-pty.out" 2>&1 &
TOP=$!
sleep 3
kill "$TOP" 2>/dev/null; wait "$TOP" 2>/dev/null
pkill -f "$M --server $URL --token $ADMIN top" 2>/dev/null
n=$(grep -o "$(printf '')\[2J" "$T/top-pty.out" | wc -l)
check "top on a terminal: the screen is redrawn every 0.5 s ($n screens in 3 s)" test "$n" -ge 3
check "top on a terminal: the running job with its step, loss and samples/s" \
    grep -Eq '^[0-9]+ +long +running +0 +[0-9]+/400 +[0-9.e-]+ +[0-9]+ ' "$T/top-pty.out"
check "exit 2: top --every 0" [ "$(code "$M" top --every 0)" = 2 ]

# --- shell completion
"$M" completion bash >"$T/mgectl.bash"
check "bash completion loads and registers" \
    sh -c "bash -c '. \"$T/mgectl.bash\"; complete -p mgectl' | grep -q _mgectl"
check "bash completion completes commands" sh -c "bash -c '. \"$T/mgectl.bash\";
    COMP_WORDS=(mgectl su); COMP_CWORD=1; _mgectl; echo \"\${COMPREPLY[*]}\"' | grep -qx submit"
check "bash completion completes job IDs from the server" sh -c "MGE_SERVER=$URL MGE_TOKEN=$ADMIN \
    PATH=$BIN:\$PATH bash -c '. \"$T/mgectl.bash\";
    COMP_WORDS=(mgectl cancel \"\"); COMP_CWORD=2; _mgectl; echo \"\${COMPREPLY[*]}\"' | grep -qw $JOB"
"$M" completion zsh >"$T/_mgectl"
if command -v zsh >/dev/null 2>&1; then
    check "zsh completion parses" zsh -n "$T/_mgectl"
else
    check "zsh completion is printed (zsh not installed: not parsed)" grep -q '^#compdef mgectl' "$T/_mgectl"
fi
check "exit 2: completion for another shell" [ "$(code "$M" completion fish)" = 2 ]
finish
