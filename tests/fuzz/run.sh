#!/bin/sh
# run.sh: build each tests/fuzz/fuzz_<name>.c as a clang libFuzzer binary in BUILD/fuzz/ and
# run it over a scratch copy of tests/fuzz/corpus/<name>/ (the committed corpus never grows).
#
# usage: tests/fuzz/run.sh BUILD short|long
#   short: 20 s per target (make test), long: 300 s per target (make fuzz);
#   FUZZ_SECONDS=N overrides either. FUZZ_TARGETS="jobspec ckpt" runs only those.
# exit: 0 all clean; 1 a crash, leak, timeout, sanitizer report or build failure
#       (the input is kept as BUILD/fuzz/<name>-crash-*); 77 (skip) without a libFuzzer clang.
#
# Adding a target: put tests/fuzz/fuzz_<name>.c here, seeds in corpus/<name>/, optionally a
# <name>.dict, and the sources it links below as deps_<name> / libs_<name> (paths from the
# repository root; $BUILD is expanded, and missing files under $BUILD are made with make).
# Targets without their own lists get deps_default / libs_default.
# shellcheck disable=SC2016,SC2034,SC2154 # the lists are read through eval, $BUILD late

deps_default='common/*.c'
libs_default='-lyaml -ljansson -lz -lm -lpthread -lcrypto'

deps_jobspec='common/*.c'
libs_jobspec='-lyaml -ljansson -lz -lm -lpthread -lcrypto'

deps_ckpt='common/*.c engine/ckpt.c engine/quant_check.c $BUILD/gen/proto/checkpoint.pb-c.c'
libs_ckpt='-lprotobuf-c -lyaml -ljansson -lz -lm -lpthread -lcrypto'

deps_safetensors='common/*.c engine/safetensors.c'
libs_safetensors='-ljansson -lyaml -lz -lm -lpthread -lcrypto'

# the control plane: REST bodies and worker frames go through the coordinator's own code
# (seeds: corpus/http_body/ by hand, corpus/worker_frame/ from gen_worker_frame_seeds.c)
deps_control='coordinator/http_api.c coordinator/store.c coordinator/sched.c coordinator/rpc.c
coordinator/auth.c coordinator/planner.c coordinator/ckpt_path.c coordinator/ckpt_store.c coordinator/store_file.c common/*.c
tests/unit/support/scratch_dir.c engine/ckpt.c $BUILD/gen/proto/checkpoint.pb-c.c
worker/link_frame.c $BUILD/gen/proto/worker.pb-c.c'
libs_control='-lmicrohttpd -lsqlite3 -lnng -lprotobuf-c -lyaml -ljansson -lz -lm -lpthread -lcrypto'
deps_http_body=$deps_control
libs_http_body=$libs_control
deps_worker_frame=$deps_control
libs_worker_frame=$libs_control

# the worker's launch socket: LaunchRequest frames into worker/launch.c and worker/ranks.c
deps_launch_request='worker/launch.c worker/ranks.c worker/gpus.c common/*.c $BUILD/gen/proto/worker.pb-c.c'
libs_launch_request='-lnng -lgnutls -luv -lprotobuf-c -lyaml -ljansson -lz -lm -lpthread -lcrypto'

# the .npy reader: header parser and loader (engine/data_npy.c with the module it belongs to)
deps_npy='engine/data_npy.c engine/data_idx.c engine/data.c common/*.c'
libs_npy='-lyaml -ljansson -lz -lm -lpthread -lcrypto'

# ---------------------------------------------------------------------------------------------
BUILD=${1:-build}
MODE=${2:-short}
CLANG=${CLANG:-clang}
cd "$(dirname "$0")/../.." || exit 1

case $MODE in
short) secs=${FUZZ_SECONDS:-20} ;;
long) secs=${FUZZ_SECONDS:-300} ;;
*) echo "usage: $0 BUILD short|long" >&2; exit 2 ;;
esac

if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "fuzz: $CLANG not found, skipping"
    exit 77
fi
mkdir -p "$BUILD/fuzz" || exit 1
probe="$BUILD/fuzz/.probe"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' > "$probe.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" 2>/dev/null; then
    echo "fuzz: $CLANG cannot build libFuzzer targets (libclang-rt-dev missing?), skipping"
    rm -f "$probe.c" "$probe"
    exit 77
fi
rm -f "$probe.c" "$probe"

failed=""
for src in tests/fuzz/fuzz_*.c; do
    [ -f "$src" ] || continue
    name=$(basename "$src" .c)
    name=${name#fuzz_}
    if [ -n "$FUZZ_TARGETS" ]; then
        case " $FUZZ_TARGETS " in *" $name "*) ;; *) continue ;; esac
    fi
    eval "deps=\${deps_$name-\$deps_default}"
    eval "libs=\${libs_$name-\$libs_default}"
    eval "deps=\"$deps\"" # expand $BUILD inside the list
    bin="$BUILD/fuzz/fuzz_$name"

    for d in $deps; do
        case $d in "$BUILD"/*) [ -f "$d" ] || make --no-print-directory BUILD="$BUILD" "$d" >/dev/null ;; esac
    done
    # shellcheck disable=SC2086 # deps and libs are word lists (and globs) on purpose
    if ! "$CLANG" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -g -O1 \
        -std=c11 -D_GNU_SOURCE -I. -I"$BUILD/gen" -o "$bin" "$src" $deps $libs; then
        echo "fuzz_$name: build failed"
        failed="$failed $name"
        continue
    fi

    corpus=$(mktemp -d "${TMPDIR:-/tmp}/mge-fuzz-$name.XXXXXX") || exit 1
    [ -d "tests/fuzz/corpus/$name" ] && cp -R "tests/fuzz/corpus/$name/." "$corpus/"
    dict=""
    [ -f "tests/fuzz/$name.dict" ] && dict="-dict=tests/fuzz/$name.dict"
    log="$BUILD/fuzz/$name.log"
    # shellcheck disable=SC2086
    "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$BUILD/fuzz/$name-" $dict "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    rm -rf "$corpus"
    if [ $rc -ne 0 ]; then
        echo "fuzz_$name: FAILED (exit $rc) after ${runs:-?} runs; log $log:"
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|^    #[0-9]' "$log" | head -n 30
        failed="$failed $name"
    else
        echo "fuzz_$name: ok, ${secs} s, ${runs:-?} runs, $cov"
    fi
done

if [ -n "$failed" ]; then
    echo "fuzz: failed:$failed"
    exit 1
fi
exit 0
