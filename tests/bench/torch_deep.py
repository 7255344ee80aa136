#!/usr/bin/python3
"""torch_deep.py: PyTorch side of the sublinear benchmark: an L-layer Linear(W)+ReLU chain,
batch B, SGD momentum, plain or with torch.utils.checkpoint.checkpoint_sequential(SEG).

Activation memory is what autograd keeps for backward at the end of the forward pass: the
bytes of the distinct non-parameter tensors packed by torch.autograd.graph.saved_tensors_hooks (with
checkpointing, the segment inputs; the recomputed segment inside backward is not counted).
Usage: torch_deep.py LAYERS WIDTH BATCH STEPS THREADS SEGMENTS(0 = plain)
"""
import json
import sys
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def main():
    layers, width, batch, steps, threads, seg = map(int, sys.argv[1:7])
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # as mge does: deep chains reach denormal gradients
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    body = nn.Sequential(*mods)
    head = nn.Linear(width, 10)
    params = list(body.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x = torch.rand(batch, width)
    if seg:  # reentrant checkpointing drops the first segment's gradients otherwise
        x.requires_grad_(True)
    y = torch.randint(0, 10, (batch,))
    lossf = nn.CrossEntropyLoss()
    times, peaks = [], []
    param_ptrs = {p.data_ptr() for p in params}
    for s in range(steps + 1):
        saved = {}

        def pack(t):
            if t.data_ptr() not in param_ptrs:  # weights are not activations
                saved[t.data_ptr()] = t.numel() * t.element_size()
            return t

        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h = checkpoint_sequential(body, seg, x) if seg else body(x)
            loss = lossf(head(h), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if s > 0:  # step 0 allocates gradients and optimiser state
            times.append(dt)
            peaks.append(sum(saved.values()))
    times.sort()
    peaks.sort()
    print(json.dumps({"layers": layers, "segments": seg, "median_step_ms": 1e3 * times[len(times) // 2],
                      "activation_bytes": peaks[len(peaks) // 2], "loss": loss.item()}))


if __name__ == "__main__":
    main()
