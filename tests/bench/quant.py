#!/usr/bin/python3
"""quant.py: int8 inference against fp32, mge-infer and PyTorch 1.13 side by side.

Trains the Fashion-MNIST MLP (784-512-512-10), LeNet-5 and ResNet-8 (width 16, the quant tests')
briefly in fp32, fine-tunes them with quantisation-aware training (quant.mode qat), and times
mge-infer on the 10,000 test images with --precision fp32 and int8 (samples/s over the graph
runs, batch 128, THREADS threads, best of ROUNDS alternating rounds), each with the batch split
across the threads (--split on, the default) and without (--split off: one graph, each op
using every thread; the "1 graph" columns; not run at 1 thread, where both are the same). PyTorch runs the same
architectures in fp32 and int8 (eager-mode static quantisation: Linear+ReLU, Conv+BN(+ReLU)
fused, the residual a quantised add_relu; on its x86 int8 engine: fbgemm when the build has it,
else onednn; Debian's 1.13 build has onednn and qnnpack only) over the same images; it is
skipped, with a line saying so, when /usr/bin/python3 cannot import torch.

Usage: quant.py BUILD [THREADS] [ROUNDS]
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

TORCH_CHILD = len(sys.argv) > 2 and sys.argv[1] == "--torch"  # quant.py --torch NAME THREADS ROUNDS
if TORCH_CHILD:
    sys.argv = [sys.argv[0], "build"] + sys.argv[3:] + [sys.argv[2]]
BUILD = sys.argv[1] if len(sys.argv) > 1 else "build"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 3
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = "/usr/share/datasets/fashion-mnist"
# name, spec, fp32 steps, QAT steps, --set overrides (ResNet-8 width 16: the quant tests' ResNet)
JOBS = [("mlp", "examples/fmnist-mlp.yaml", 300, 100, []),
        ("lenet", "examples/fmnist-lenet.yaml", 300, 100, []),
        ("resnet8", "examples/fmnist-resnet20.yaml", 60, 30,
         ["model.depth=8", "train.batch_size=64"])]
TORCH_LIB = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def train(spec, out, steps, sets, extra):
    cmd = [os.path.join(BUILD, "bin", "mge-train"), os.path.join(ROOT, spec), "--json",
           "--threads", str(THREADS), "--set", "train.steps=%d" % steps,
           "--set", "train.eval=false", "--out", out] + extra
    for kv in sets:
        cmd += ["--set", kv]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    return os.path.join(out, "latest.mgeckpt")


def infer(ckpt, precision, split):
    cmd = [os.path.join(BUILD, "bin", "mge-infer"), ckpt, "--json", "--threads", str(THREADS),
           "--precision", precision, "--timing", "--split", split]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    d = last_json(r.stdout)
    return d["samples_per_sec"], d["test_accuracy"]


def torch_bench(name):
    """(fp32 samples/s, int8 samples/s, engine) for PyTorch, or a string saying why not."""
    try:
        import numpy as np
        import torch
        import torch.nn as nn
        import torch.ao.quantization as tq
    except Exception as e:  # noqa: BLE001 (any import failure means: no PyTorch here)
        return "skip - PyTorch is not importable with /usr/bin/python3 (%s)" % e
    engines = torch.backends.quantized.supported_engines
    engine = "fbgemm" if "fbgemm" in engines else "onednn" if "onednn" in engines else None
    if engine is None:
        return "skip - this PyTorch has no x86 int8 engine (%s)" % ", ".join(engines)
    torch.backends.quantized.engine = engine
    torch.set_num_threads(THREADS)
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    x = torch.from_numpy((x.astype(np.float32) / 255.0 - 0.2860) / 0.3530)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.dq = tq.QuantStub(), tq.DeQuantStub()
            self.fc1, self.r1 = nn.Linear(784, 512), nn.ReLU()
            self.fc2, self.r2 = nn.Linear(512, 512), nn.ReLU()
            self.fc3 = nn.Linear(512, 10)

        def forward(self, t):
            t = self.q(t.reshape(t.shape[0], -1))
            return self.dq(self.fc3(self.r2(self.fc2(self.r1(self.fc1(t))))))

        fuse = [["fc1", "r1"], ["fc2", "r2"]]

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.dq = tq.QuantStub(), tq.DeQuantStub()
            self.c1, self.c2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
            self.p, self.r = nn.MaxPool2d(2), nn.ReLU()
            self.fc1, self.r1 = nn.Linear(400, 120), nn.ReLU()
            self.fc2, self.r2 = nn.Linear(120, 84), nn.ReLU()
            self.fc3 = nn.Linear(84, 10)

        def forward(self, t):
            t = self.q(t)
            t = self.r(self.p(self.c1(t)))
            t = self.r(self.p(self.c2(t)))
            t = t.reshape(t.shape[0], -1)
            return self.dq(self.fc3(self.r2(self.fc2(self.r1(self.fc1(t))))))

        fuse = [["fc1", "r1"], ["fc2", "r2"]]

    class Block(nn.Module):
        """A basic block as mge's resnet builds it: conv-bn-relu, conv-bn, + shortcut (a 1x1
        conv-bn where the shape changes), relu; fused for int8 as conv+bn+relu, conv+bn and a
        quantised add_relu."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1, self.relu1 = nn.BatchNorm2d(cout), nn.ReLU()
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))
            self.add = nn.quantized.FloatFunctional()

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
            return self.add.add_relu(y, x if self.down is None else self.down(x))

        def fuse_list(self, prefix):
            f = [[prefix + "conv1", prefix + "bn1", prefix + "relu1"], [prefix + "conv2", prefix + "bn2"]]
            return f + ([[prefix + "down.0", prefix + "down.1"]] if self.down is not None else [])

    class ResNet8(nn.Module):
        def __init__(self, width=16):
            super().__init__()
            self.q, self.dq = tq.QuantStub(), tq.DeQuantStub()
            self.conv1 = nn.Conv2d(1, width, 3, 1, 1, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(width), nn.ReLU()
            self.blocks = nn.Sequential(Block(width, width, 1), Block(width, 2 * width, 2),
                                        Block(2 * width, 4 * width, 2))
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(4 * width, 10)
            self.fuse = [["conv1", "bn1", "relu"]] + [
                f for i, b in enumerate(self.blocks) for f in b.fuse_list("blocks.%d." % i)]

        def forward(self, t):
            t = self.blocks(self.relu(self.bn1(self.conv1(self.q(t)))))
            return self.dq(self.fc(torch.flatten(self.pool(t), 1)))

    torch.manual_seed(0)
    m = {"mlp": Mlp, "lenet": LeNet, "resnet8": ResNet8}[name]().eval()
    batches = list(torch.split(x, 128))

    def rate(model):
        best = 0.0
        with torch.no_grad():
            model(batches[0])
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                for b in batches:
                    model(b)
                best = max(best, x.shape[0] / (time.perf_counter() - t0))
        return best

    fp = rate(m)
    q = tq.fuse_modules(m, m.fuse)
    q.qconfig = tq.get_default_qconfig(engine)
    q = tq.prepare(q)
    with torch.no_grad():
        for b in batches[:10]:
            q(b)
    q = tq.convert(q)
    return fp, rate(q), engine


def torch_run(name):
    """torch_bench(name) in a child with PyTorch's best BLAS setup (docs/benchmarks.md)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    if os.path.isdir(TORCH_LIB):
        env["LD_LIBRARY_PATH"] = TORCH_LIB
    env.pop("OPENBLAS_CORETYPE", None)
    r = subprocess.run(["/usr/bin/python3", os.path.abspath(__file__), "--torch", name, str(THREADS),
                        str(ROUNDS)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return "skip - PyTorch run failed: %s" % (r.stderr.strip().splitlines() or ["?"])[-1]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return tuple(out) if isinstance(out, list) else out


def main():
    if not os.path.exists(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")):
        print("skip - dataset-fashion-mnist is not installed")
        return
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = open("/proc/cpuinfo").read()
    print("cpu: %s, avx512_vnni: %s, %d threads, load at start: %s" % (
        cpu, "yes" if "avx512_vnni" in flags else "no", THREADS,
        " ".join(open("/proc/loadavg").read().split()[:3])))
    print("%-7s %12s %12s %12s %12s %8s %10s %10s | %12s %12s %8s" % (
        "model", "fp32 1 graph", "mge fp32/s", "int8 1 graph", "mge int8/s", "speedup",
        "fp32 acc", "int8 acc", "torch fp32/s", "torch int8/s", "speedup"))
    splits = ("off", "on") if THREADS > 1 else ("on",)
    with tempfile.TemporaryDirectory() as t:
        for name, spec, steps, qat_steps, sets in JOBS:
            ck32 = train(spec, os.path.join(t, name), steps, sets, [])
            ck = train(spec, os.path.join(t, name + "-qat"), qat_steps, sets,
                       ["--init-from", ck32, "--set", "quant.mode=qat"])
            best = {(p, s): (0.0, 0.0) for p in ("fp32", "int8") for s in ("off", "on")}
            for _ in range(ROUNDS):
                for p in ("fp32", "int8"):
                    for s in splits:
                        sps, acc = infer(ck, p, s)
                        best[p, s] = max(best[p, s], (sps, acc))
            for p in ("fp32", "int8"):
                best[p, "off"] = best[p, "off"] if THREADS > 1 else best[p, "on"]
            tb = torch_run(name)
            tcols = ("%12.0f %12.0f %7.2fx (%s)" % (tb[0], tb[1], tb[1] / tb[0], tb[2])
                     if isinstance(tb, tuple) else tb)
            print("%-7s %12.0f %12.0f %12.0f %12.0f %7.2fx %10.4f %10.4f | %s" % (
                name, best["fp32", "off"][0], best["fp32", "on"][0], best["int8", "off"][0],
                best["int8", "on"][0], best["int8", "on"][0] / best["fp32", "on"][0],
                best["fp32", "on"][1], best["int8", "on"][1], tcols))
    print("load at end: %s" % " ".join(open("/proc/loadavg").read().split()[:3]))


if TORCH_CHILD:
    print(json.dumps(torch_bench(sys.argv[-1])))
else:
    main()
