#!/usr/bin/python3
"""engine.py: mge-train against PyTorch on the same jobs, side by side in one run.

For each model (MLP 784-512-512-10, LeNet-5 and ResNet-20 on Fashion-MNIST, batch 128, SGD
momentum):
runs mge and PyTorch alternately (ROUNDS rounds), each for STEPS training steps with THREADS
threads, and prints samples/s from the median step time (robust on a shared machine), the
throughput ratio mge/PyTorch, and both peak RSS figures. PyTorch runs at its best here: with
OpenMP OpenBLAS, and with whichever OPENBLAS_CORETYPE setting (unset or SkylakeX) is faster.

Usage: engine.py BUILD [THREADS] [ROUNDS] [MODELS]   (MODELS: comma-separated, default all)
"""
import json
import os
import subprocess
import sys
import tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOBS = [("mlp", "examples/fmnist-mlp.yaml", 469), ("lenet", "examples/fmnist-lenet.yaml", 300),
        ("resnet20", "examples/fmnist-resnet20.yaml", 60)]
if len(sys.argv) > 4:
    JOBS = [j for j in JOBS if j[0] in sys.argv[4].split(",")]
TORCH_LIB = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def run_mge(spec, steps, out):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    cmd = [os.path.join(BUILD, "bin", "mge-train"), os.path.join(ROOT, spec), "--json",
           "--threads", str(THREADS), "--set", "train.steps=%d" % steps,
           "--set", "train.checkpoint_every=0", "--out", out]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    d = last_json(r.stdout)
    return {"median_ms": d["median_step_ms"], "sps": d["samples_per_sec"],
            "rss": d["peak_rss_bytes"], "acc": d.get("test_accuracy")}


def run_torch(model, steps, coretype):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    if os.path.isdir(TORCH_LIB):
        env["LD_LIBRARY_PATH"] = TORCH_LIB
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_ref.py"), model, "1",
                        str(THREADS), str(steps)], env=env, capture_output=True, text=True,
                       check=True)
    d = last_json(r.stdout)
    return {"median_ms": d["median_step_ms"], "sps": d["samples_per_sec"],
            "rss": d["peak_rss_bytes"], "acc": d.get("test_accuracy")}


def main():
    try:
        subprocess.run(["/usr/bin/python3", "-c", "import torch"], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print("engine bench: skipped (python3-torch not installed: apt-get install "
              "python3-torch libopenblas0-openmp)")
        return 0
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print("engine bench: %d threads, %d rounds, load average %s at start" % (THREADS, ROUNDS, load))
    # PyTorch at its best: pick the faster OpenBLAS core type on a short MLP run
    probe = {ct: run_torch("mlp", 100, ct)["median_ms"] for ct in ("", "SkylakeX")}
    coretype = min(probe, key=probe.get)
    print("  pytorch OpenBLAS core type: %s (median step %.2f ms unset, %.2f ms SkylakeX)"
          % (coretype or "unset", probe[""], probe["SkylakeX"]))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, spec, steps in JOBS:
            best = {"mge": None, "torch": None}
            for _ in range(ROUNDS):
                for side in ("mge", "torch"):
                    r = run_mge(spec, steps, tmp) if side == "mge" else run_torch(model, steps, coretype)
                    if best[side] is None or r["median_ms"] < best[side]["median_ms"]:
                        best[side] = r
            rows.append((model, best["mge"], best["torch"]))
    print("  %-8s %14s %14s %9s %10s %10s %9s" % ("model", "mge samples/s", "torch samples/s",
                                                 "ratio", "mge RSS", "torch RSS", "RSS ratio"))
    for model, m, t in rows:
        ms, ts = 128e3 / m["median_ms"], 128e3 / t["median_ms"]
        print("  %-8s %14.0f %14.0f %8.2fx %8.1fMi %8.1fMi %8.2fx" % (
            model, ms, ts, ms / ts, m["rss"] / 2**20, t["rss"] / 2**20, m["rss"] / t["rss"]))
    with open("/proc/loadavg") as f:
        print("  load average at end: %s" % f.read().split()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
