#!/usr/bin/python3
"""gpt.py: mge-train's GPT against PyTorch 1.13's (tests/bench/torch_gpt.py), side by side.

examples/gpt-text.yaml's model (4 layers, d_model 128, 4 heads, context 128, byte vocabulary,
batch 16 x 128 tokens, AdamW, clipping at 1.0; no dropout on either side) on the fortunes text, STEPS steps with THREADS
threads each, mge and PyTorch alternately for ROUNDS rounds (best median of each); prints
tokens/s from the median step time, the ratio, and both peak RSS figures. PyTorch runs with
OpenMP OpenBLAS, as tests/bench/engine.py runs it.

Usage: gpt.py BUILD [THREADS] [ROUNDS] [STEPS]
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 40
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TORCH_LIB = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
TOKENS = 16 * 128


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def run(side, out):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    env.pop("OPENBLAS_CORETYPE", None)
    if side == "mge":
        cmd = [os.path.join(BUILD, "bin", "mge-train"), os.path.join(ROOT, "examples/gpt-text.yaml"),
               "--json", "--threads", str(THREADS), "--set", "train.steps=%d" % STEPS,
               "--set", "train.checkpoint_every=0", "--set", "data.test_fraction=0",
               "--set", "model.dropout=0", "--out", out]  # the torch twin has no dropout
    else:
        if os.path.isdir(TORCH_LIB):
            env["LD_LIBRARY_PATH"] = TORCH_LIB
        cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_gpt.py"), str(THREADS), str(STEPS)]
    d = last_json(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
    return d["median_step_ms"], d["peak_rss_bytes"]


def main():
    try:
        subprocess.run(["/usr/bin/python3", "-c", "import torch"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print("gpt bench: skipped (python3-torch not installed)")
        return 0
    with open("/proc/loadavg") as f:
        print("gpt bench: %d threads, %d rounds of %d steps, load average %s at start"
              % (THREADS, ROUNDS, STEPS, f.read().split()[0]))
    best = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(ROUNDS):
            for side in ("mge", "torch"):
                ms, rss = run(side, tmp)
                if side not in best or ms < best[side][0]:
                    best[side] = (ms, rss)
    (mm, mr), (tm, tr) = best["mge"], best["torch"]
    print("  %-10s %12s %14s %7s %10s %10s %9s" % ("model", "mge tok/s", "torch tok/s", "ratio",
                                                  "mge RSS", "torch RSS", "RSS ratio"))
    print("  %-10s %12.0f %14.0f %6.2fx %8.1fMi %8.1fMi %8.2fx" % (
        "gpt-mini", TOKENS * 1e3 / mm, TOKENS * 1e3 / tm, tm / mm, mr / 2**20, tr / 2**20, mr / tr))
    print("  median step: mge %.1f ms, torch %.1f ms" % (mm, tm))
    with open("/proc/loadavg") as f:
        print("  load average at end: %s" % f.read().split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
