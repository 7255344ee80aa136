#!/bin/sh
# gpt_torch.sh: parity of model type gpt with PyTorch at step 1. A 2-layer GPT written as
# nanoGPT writes it (torch.nn, GELU with the tanh approximation, lm_head tied to wte) is
# initialised by torch (nanoGPT's init), saved as safetensors and loaded with mge-train
# --init-from; one SGD step (lr 1024, so the step's update is -1024 times the gradient, exactly
# scaled, and p0 - p1 loses little to rounding) on a uint16 token
# file; the step-1 loss and every parameter's gradient (from mge-export of the step-1
# checkpoint) match torch's on the same windows (relative 1e-4). Skips without torch.
. "$(dirname "$0")/lib/train.sh"
PY=/usr/bin/python3
if ! $PY -c 'import torch' 2>/dev/null; then
    echo "skip - /usr/bin/python3 has no torch (apt-get install python3-torch)"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

cat > "$T/ref.py" <<'PY'
import json, math, struct, sys
import torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(1)
L, H, C, T, V, B, SEED = 2, 2, 32, 16, 64, 4, 5
M64 = (1 << 64) - 1

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)

def window(n, step, row):  # engine/data_tokens.c: mge_tokens_window
    return mix64(SEED ^ mix64(((step * 0x9E3779B97F4A7C15) & M64) ^ mix64((row + 0x632BE59BD9B4E019) & M64))) % (n - T)

class Attn(nn.Module):
    def __init__(s):
        super().__init__(); s.c_attn = nn.Linear(C, 3 * C); s.c_proj = nn.Linear(C, C)
    def forward(s, x):
        q, k, v = s.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(x.shape[0], T, H, C // H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
        return s.c_proj((att @ v).transpose(1, 2).reshape(x.shape[0], T, C))

class MLP(nn.Module):
    def __init__(s):
        super().__init__(); s.c_fc = nn.Linear(C, 4 * C); s.c_proj = nn.Linear(4 * C, C)
    def forward(s, x):
        return s.c_proj(F.gelu(s.c_fc(x), approximate="tanh"))

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.ln_1 = nn.LayerNorm(C); s.attn = Attn(); s.ln_2 = nn.LayerNorm(C); s.mlp = MLP()
    def forward(s, x):
        x = x + s.attn(s.ln_1(x)); return x + s.mlp(s.ln_2(x))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
                                           h=nn.ModuleList([Block() for _ in range(L)]), ln_f=nn.LayerNorm(C)))
        s.lm_head = nn.Linear(C, V, bias=False)
        s.lm_head.weight = s.transformer.wte.weight  # tied
        for n, p in s.named_parameters():  # nanoGPT's init
            if n.endswith("c_proj.weight"): nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif n.endswith("bias"): nn.init.zeros_(p)
            elif "ln_" in n: nn.init.ones_(p)
            else: nn.init.normal_(p, 0.0, 0.02)
    def forward(s, idx, y):
        x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(T))
        for b in s.transformer.h: x = b(x)
        logits = s.lm_head(s.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, V), y.view(-1))

def st_write(path, sd):
    hdr, off, raws = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in sd.items():
        raw = t.detach().contiguous().numpy().tobytes()
        hdr[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw); raws.append(raw)
    h = json.dumps(hdr).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(raws))

def st_read(path):
    d = open(path, "rb").read(); n = struct.unpack("<Q", d[:8])[0]; hdr = json.loads(d[8:8 + n])
    return {k: torch.frombuffer(bytearray(d[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]]),
                                dtype=torch.float32).reshape(e["shape"])
            for k, e in hdr.items() if k != "__metadata__"}

cmd, d = sys.argv[1], sys.argv[2]
if cmd == "make":
    torch.manual_seed(123)
    m = GPT()
    sd = {k: v for k, v in m.state_dict().items() if k != "lm_head.weight"}
    st_write(d + "/init.safetensors", sd)
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, V, (3000,), generator=g).tolist()
    open(d + "/tokens.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))
else:  # check: step-1 loss and gradients against mge's
    mge_loss, tol = float(sys.argv[3]), 1e-4
    ids = list(struct.unpack("<3000H", open(d + "/tokens.bin", "rb").read()))
    starts = [window(len(ids), 0, r) for r in range(B)]
    x = torch.tensor([ids[s:s + T] for s in starts]); y = torch.tensor([ids[s + 1:s + T + 1] for s in starts])
    m = GPT(); sd0 = st_read(d + "/init.safetensors")
    m.load_state_dict(dict(sd0, **{"lm_head.weight": sd0["transformer.wte.weight"]}), strict=True)
    loss = m(x, y); loss.backward()
    fails = 0
    rel = abs(loss.item() - mge_loss) / abs(loss.item())
    print("  %s: step-1 loss torch %.7f, mge %.7f (relative %.1e)" % ("ok" if rel <= tol else "FAIL", loss.item(), mge_loss, rel))
    fails += rel > tol
    sd1, worst = st_read(d + "/step1.safetensors"), (0.0, "")
    grads = dict(m.named_parameters())
    for name, p0 in sd0.items():
        g_mge = (p0 - sd1[name]) / 1024.0  # SGD, lr 1024: p1 = p0 - 1024 grad
        g_t = grads[name].grad
        r = ((g_mge - g_t).norm() / g_t.norm().clamp_min(1e-12)).item()
        worst = max(worst, (r, name))
        if r > tol:
            fails += 1; print("  FAIL: gradient of %s: relative error %.2e" % (name, r))
    print("  %s: %d gradients (wte's sums the embedding and the tied output layer), worst relative error %.1e (%s)"
          % ("ok" if worst[0] <= tol else "FAIL", len(sd0), worst[0], worst[1]))
    sys.exit(1 if fails else 0)
PY

$PY "$T/ref.py" make "$T" || { echo "FAIL: torch reference setup"; exit 1; }
cat > "$T/gpt.yaml" <<EOF
name: gpt-parity
model: {type: gpt, layers: 2, heads: 2, d_model: 32, context: 16, vocab: 64}
data: {format: tokens, dtype: uint16, train_files: [$T/tokens.bin], test_fraction: 0}
train:
  steps: 1
  batch_size: 4
  optimizer: {type: sgd, lr: 1024}
  seed: 5
resources: {device: cpu}
EOF
"$BIN/mge-train" "$T/gpt.yaml" --init-from "$T/init.safetensors" --json --out "$T/run" \
    > "$T/run.out" 2> "$T/run.err" || { echo "FAIL: mge-train: $(tail -n 3 "$T/run.err")"; exit 1; }
"$BIN/mge-export" "$T/run/latest.mgeckpt" --format safetensors --output "$T/step1.safetensors" \
    2> "$T/export.err" || { echo "FAIL: mge-export: $(cat "$T/export.err")"; exit 1; }
loss1=$(grep '^{"step":1,' "$T/run.out" | sed 's/.*"loss":\([^,]*\),.*/\1/')
$PY "$T/ref.py" check "$T" "$loss1"
