#!/usr/bin/python3
"""sublinear.py: recompute-instead-of-store, mge against PyTorch's checkpoint_sequential.

For the deep MLP (examples/deep-mlp.yaml: L x (Linear 1024 + ReLU), batch 256) at 128 and 256
layers: mge's activation bytes (the planner's arena; its measured RSS growth is checked against
the plan) and median step time, plain vs sublinear; the same for PyTorch plain vs
checkpoint_sequential(sqrt(L) segments). Then the largest batch at a fixed budget with and
without sublinear (deep MLP and LeNet), and the planner's quality and speed.
Usage: sublinear.py BUILD [THREADS] [STEPS]
"""
import json
import math
import os
import subprocess
import sys

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(BUILD, "bin", "mge-train")
SPEC = os.path.join(ROOT, "examples", "deep-mlp.yaml")
ENV = dict(os.environ, OMP_NUM_THREADS=str(THREADS))


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def mge(layers, mode):
    sets = ["--set", "model.layers=%d" % layers, "--set", "memory.sublinear=%s" % mode]
    plan = last_json(subprocess.run([TRAIN, "--plan", SPEC] + sets, capture_output=True,
                                    text=True, check=True, env=ENV).stdout)
    run = last_json(subprocess.run([TRAIN, SPEC, "--json", "--threads", str(THREADS), "--out",
                                    "/tmp/mge-bench-sublinear", "--set", "train.steps=%d" % STEPS]
                                   + sets, capture_output=True, text=True, check=True,
                                   env=ENV).stdout)
    return {"act": plan["activation_bytes"], "ms": run["median_step_ms"],
            "flops": plan["chosen"]["recompute_flops"], "step_flops": plan["step_flops"],
            "planned": run["engine_planned_bytes"], "measured": run["engine_measured_bytes"],
            "loss": run["final_loss"]}


def torch_run(layers, seg):
    env = dict(ENV)
    if os.path.isdir("/usr/lib/x86_64-linux-gnu/openblas-openmp"):
        env["LD_LIBRARY_PATH"] = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    r = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_deep.py"), str(layers),
                        "1024", "256", str(STEPS), str(THREADS), str(seg)],
                       capture_output=True, text=True, check=True, env=env)
    return last_json(r.stdout)


def have_torch():
    return subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                          capture_output=True).returncode == 0


def main():
    torch_ok = have_torch()
    print("sublinear bench: %d threads, %d steps per run%s" % (
        THREADS, STEPS, "" if torch_ok else " (PyTorch side skipped: python3-torch missing)"))
    print("  %-7s %-10s %12s %9s %10s %9s   %s" % ("layers", "side", "activations", "of plain",
                                                   "step ms", "x plain", "plan vs measured"))
    for layers in (128, 256):
        p, s = mge(layers, "false"), mge(layers, "true")
        for name, r in (("mge plain", p), ("mge sublin", s)):
            print("  %-7d %-10s %10.1fMi %8.1f%% %10.1f %8.2fx   %.1f / %.1f MiB (%+.1f%%)" % (
                layers, name, r["act"] / 2**20, 100.0 * r["act"] / p["act"], r["ms"],
                r["ms"] / p["ms"], r["planned"] / 2**20, r["measured"] / 2**20,
                100.0 * (r["measured"] - r["planned"]) / r["planned"]))
        print("  %-7d recomputed %.1f of %.1f GFLOP per step; losses %s" % (
            layers, s["flops"] / 1e9, p["step_flops"] / 1e9,
            "bit-identical" if p["loss"] == s["loss"] else "DIFFER (%r vs %r)" % (p["loss"], s["loss"])))
        if torch_ok:
            seg = int(round(math.sqrt(layers)))
            tp, ts = torch_run(layers, 0), torch_run(layers, seg)
            for name, r in (("torch", tp), ("torch ckpt", ts)):
                print("  %-7d %-10s %10.1fMi %8.1f%% %10.1f %8.2fx   (saved for backward; %d segments)" % (
                    layers, name, r["activation_bytes"] / 2**20,
                    100.0 * r["activation_bytes"] / tp["activation_bytes"], r["median_step_ms"],
                    r["median_step_ms"] / tp["median_step_ms"], r["segments"]))
    for spec, budget in (("deep-mlp.yaml", 2048), ("fmnist-lenet.yaml", 64), ("fmnist-mlp.yaml", 64)):
        r = last_json(subprocess.run([TRAIN, "--max-batch", os.path.join(ROOT, "examples", spec),
                                      "--set", "memory.budget_mb=%d" % budget],
                                     capture_output=True, text=True, check=True).stdout)
        print("  max batch in %d MiB, %s: plain %d, light %d, sublinear %d (%.2fx)" % (
            budget, spec, r["max_batch_plain"], r["max_batch_light"], r["max_batch_sublinear"],
            r["ratio"]))
    for spec in ("fmnist-mlp.yaml", "fmnist-lenet.yaml", "deep-mlp.yaml"):
        for mode in ("false", "true"):
            d = last_json(subprocess.run([TRAIN, "--plan", os.path.join(ROOT, "examples", spec),
                                          "--set", "memory.sublinear=" + mode],
                                         capture_output=True, text=True, check=True).stdout)
            print("  planner, %s sublinear=%s: arena %.2f MiB, lower bound %.2f MiB, %.3fx" % (
                spec, mode, d["activation_bytes"] / 2**20, d["lower_bound_bytes"] / 2**20,
                d["activation_bytes"] / d["lower_bound_bytes"]))
    bench = os.path.join(BUILD, "bench", "bench_planner")
    # the Makefile links it as it links everything else (`make bench` builds it first)
    subprocess.run(["make", "--no-print-directory", "-C", ROOT, "BUILD=" + os.path.abspath(BUILD),
                    os.path.join(os.path.abspath(BUILD), "bench", "bench_planner")], check=True)
    bench = os.path.join(os.path.abspath(BUILD), "bench", "bench_planner")
    sys.stdout.flush()
    subprocess.run([bench], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
