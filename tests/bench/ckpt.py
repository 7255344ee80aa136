#!/usr/bin/python3
"""ckpt.py: the cost of background checkpoints, side by side with checkpoints off.

The Fashion-MNIST MLP (examples/fmnist-mlp.yaml, batch 128, SGD momentum) runs STEPS steps with
train.checkpoint_every=EVERY and with train.checkpoint_every=0 (only the final checkpoint, which
is not part of any step), alternately, ROUNDS rounds each, THREADS threads. Per run, mge-train
reports the median step time and the mean step time including the time the loop spent on
checkpoints (snapshot copy, and waiting for the writer when the previous write still ran):
the mean is what a checkpoint really costs (the median hides the one step in EVERY that
snapshots), the median shows whether the writer thread slows the steps around it. The ratios
compare the medians over runs of each figure. Goal: mean ratio <= 1.03.

On a shared machine whose load swings, the side-by-side ratio is mostly noise; so each
checkpointing run also gives a bound that load does not move: the loop's own checkpoint time
plus all the CPU time the writer thread used, over the run's training time (as if every
writer CPU-second were taken from the step loop, which is the worst case on busy cores).

Usage: ckpt.py BUILD [THREADS] [ROUNDS] [STEPS] [EVERY]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 400
EVERY = int(sys.argv[5]) if len(sys.argv) > 5 else 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(every, out):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    cmd = [os.path.join(BUILD, "bin", "mge-train"), os.path.join(ROOT, "examples/fmnist-mlp.yaml"),
           "--json", "--threads", str(THREADS), "--set", "train.steps=%d" % STEPS,
           "--set", "train.eval=false", "--set", "train.checkpoint_every=%d" % every,
           "--out", out]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    d = json.loads(r.stdout.strip().splitlines()[-1])
    files = [f for f in os.listdir(out) if f.startswith("ckpt-")]
    size = os.path.getsize(os.path.join(out, sorted(files)[-1])) if files else 0
    return d, len(files), size


def main():
    res = {0: [], EVERY: []}
    with tempfile.TemporaryDirectory(prefix="mge-bench-ckpt-") as tmp:
        for r in range(ROUNDS):
            for every in (0, EVERY):
                out = os.path.join(tmp, "r%d-e%d" % (r, every))
                d, n, size = run(every, out)
                res[every].append(d)
                bound = ((d["checkpoint_ms"] + d["checkpoint_writer_cpu_ms"])
                         / (d["mean_step_ms"] * d["steps_run"]) if every else 0.0)
                d["bound"] = bound
                print("round %d checkpoint_every %3d: median %.3f ms, mean %.3f ms, "
                      "loop checkpoint time %.1f ms, writer CPU %.1f ms, in %d files of %.1f MiB "
                      "(bound %.2f %%), loss %.7g"
                      % (r, every, d["median_step_ms"], d["mean_step_ms"], d["checkpoint_ms"],
                         d["checkpoint_writer_cpu_ms"], n, size / 1048576.0, 100 * bound,
                         d["final_loss"]), flush=True)
    off_med = statistics.median(d["median_step_ms"] for d in res[0])
    on_med = statistics.median(d["median_step_ms"] for d in res[EVERY])
    off_mean = statistics.median(d["mean_step_ms"] for d in res[0])
    on_mean = statistics.median(d["mean_step_ms"] for d in res[EVERY])
    same = all(a["final_loss"] == b["final_loss"] for a, b in zip(res[0], res[EVERY]))
    bound = statistics.median(d["bound"] for d in res[EVERY])
    print("MLP %d steps, %d threads, %d rounds: checkpoints off median %.3f ms mean %.3f ms; "
          "every %d steps median %.3f ms mean %.3f ms; ratio median %.3f mean %.3f (goal <= 1.03); "
          "bound (loop checkpoint time + writer CPU) / training time %.2f %%; losses %s; load %s"
          % (STEPS, THREADS, ROUNDS, off_med, off_mean, EVERY, on_med, on_mean, on_med / off_med,
             on_mean / off_mean, 100 * bound, "equal" if same else "DIFFER",
             " ".join("%.2f" % x for x in os.getloadavg())))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
