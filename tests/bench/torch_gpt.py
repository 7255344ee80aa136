#!/usr/bin/python3
"""torch_gpt.py: the PyTorch twin of mge's model type gpt, as nanoGPT writes it (GELU with the
tanh approximation, lm_head tied to wte, nanoGPT's init), and a training benchmark of it.

Imported by tests/integration/gpt_torch.sh (step-1 parity) and run by tests/bench/gpt.py:

Usage: torch_gpt.py THREADS STEPS   trains examples/gpt-text.yaml's model and schedule on the
                                    same text; prints one JSON line (median step, tokens/s, RSS)
"""
import json
import math
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(s, C, H, T):
        super().__init__()
        s.C, s.H, s.T = C, H, T
        s.c_attn = nn.Linear(C, 3 * C)
        s.c_proj = nn.Linear(C, C)
        s.register_buffer("mask", torch.tril(torch.ones(T, T)) == 0, persistent=False)

    def forward(s, x):
        B, T, C, H = x.shape[0], s.T, s.C, s.H
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in s.c_attn(x).split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(s.mask, float("-inf")).softmax(-1)
        return s.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(s, C):
        super().__init__()
        s.c_fc = nn.Linear(C, 4 * C)
        s.c_proj = nn.Linear(4 * C, C)

    def forward(s, x):
        return s.c_proj(F.gelu(s.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(s, C, H, T):
        super().__init__()
        s.ln_1, s.attn, s.ln_2, s.mlp = nn.LayerNorm(C), Attn(C, H, T), nn.LayerNorm(C), MLP(C)

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.mlp(s.ln_2(x))


class GPT(nn.Module):
    def __init__(s, L, H, C, T, V):
        super().__init__()
        s.T, s.V = T, V
        s.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
            h=nn.ModuleList([Block(C, H, T) for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.transformer.wte.weight  # tied
        for n, p in s.named_parameters():  # nanoGPT's init
            if n.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif n.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in n:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(s, idx, y):
        x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(s.T))
        for b in s.transformer.h:
            x = b(x)
        logits = s.lm_head(s.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, s.V), y.view(-1))


def main():
    threads, steps = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    L, H, C, T, V, B = 4, 4, 128, 128, 256, 16  # examples/gpt-text.yaml
    text = b"".join(open("/usr/share/games/fortunes/" + f, "rb").read()
                    for f in ("fortunes", "literature", "riddles"))
    data = torch.tensor(list(text[:len(text) - len(text) // 10]), dtype=torch.int64)
    model = GPT(L, H, C, T, V)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"framework": "pytorch " + torch.__version__, "threads": threads,
                      "steps": steps, "median_step_ms": 1e3 * med, "tokens_per_sec": B * T / med,
                      "final_loss": loss.item(),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":
    main()
