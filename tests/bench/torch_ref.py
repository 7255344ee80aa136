#!/usr/bin/python3
"""torch_ref.py: the PyTorch side of mge's engine benchmark, on the same protocol as mge-train.

Same model, init family, optimiser, batch, epochs and data (Debian's Fashion-MNIST, pixels
scaled to [0, 1], reshuffled every epoch). samples/s counts the training loop only (batch
gather, forward, backward, update), as mge-train does. Prints one JSON object.

Usage: torch_ref.py mlp|lenet|resnet20|deep-mlp EPOCHS THREADS [STEPS]
"""
import gzip
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn

D = "/usr/share/datasets/fashion-mnist/"


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def model_of(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                             nn.ReLU(), nn.Linear(512, 10))
    if kind == "lenet":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                             nn.Linear(84, 10))
    if kind.startswith("resnet"):
        return ResNet(int(kind[len("resnet"):] or 20))
    raise SystemExit("unknown model " + kind)


class Block(nn.Module):
    """A CIFAR-style basic block with a 1x1 conv + batch-norm shortcut where the shape changes
    (option B), as examples/fmnist-resnet20.yaml builds it."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    def __init__(self, depth, width=16, classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for i, stride in enumerate((1, 2, 2)):
            cout = width << i
            layers.append(nn.Sequential(*[Block(cin if b == 0 else cout, cout,
                                                stride if b == 0 else 1) for b in range(n)]))
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.layers(torch.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def main():
    kind, epochs, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    max_steps = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as mge does: deep chains reach denormal gradients
    torch.manual_seed(int(os.environ.get("SEED", "42")))
    xtr = torch.from_numpy(idx(D + "train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    ytr = torch.from_numpy(idx(D + "train-labels-idx1-ubyte.gz").astype(np.int64))
    xte = torch.from_numpy(idx(D + "t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    yte = torch.from_numpy(idx(D + "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    xtr, xte = xtr.unsqueeze(1), xte.unsqueeze(1)
    model = model_of(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    B, n = 128, xtr.shape[0]
    train_sec, samples, steps, step_times = 0.0, 0, 0, []
    acc = float("nan")
    for epoch in range(epochs):
        perm = torch.randperm(n)
        model.train()
        for at in range(0, n, B):
            t0 = time.perf_counter()
            idxs = perm[at:at + B]
            xb, yb = xtr[idxs], ytr[idxs]
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(xb), yb)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            train_sec += dt
            step_times.append(dt)
            samples += xb.shape[0]
            steps += 1
            if max_steps and steps >= max_steps:
                break
        model.eval()
        with torch.no_grad():
            correct = sum((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
                          for i in range(0, xte.shape[0], 1000))
        acc = correct / xte.shape[0]
        if max_steps and steps >= max_steps:
            break
    step_times.sort()
    print(json.dumps({
        "framework": "pytorch " + torch.__version__, "model": kind, "threads": threads,
        "steps": steps, "samples_per_sec": samples / train_sec,
        "median_step_ms": 1000 * step_times[len(step_times) // 2],
        "test_accuracy": acc, "final_loss": loss.item(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }))


if __name__ == "__main__":
    main()
