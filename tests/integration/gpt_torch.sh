#!/bin/sh
# gpt_torch.sh: parity of model type gpt with PyTorch at step 1. A 2-layer GPT written as
# nanoGPT writes it (tests/bench/torch_gpt.py: GELU with the tanh approximation, lm_head tied) is
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
import torch
sys.path.insert(0, sys.argv[3])
from torch_gpt import GPT as TorchGPT  # tests/bench/torch_gpt.py: nanoGPT's layout and init
torch.set_num_threads(1)
L, H, C, T, V, B, SEED = 2, 2, 32, 16, 64, 4, 5
M64 = (1 << 64) - 1

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)

def window(n, step, row):  # engine/data_tokens.c: mge_tokens_window
    return mix64(SEED ^ mix64(((step * 0x9E3779B97F4A7C15) & M64) ^ mix64((row + 0x632BE59BD9B4E019) & M64))) % (n - T)

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
    m = TorchGPT(L, H, C, T, V)
    sd = {k: v for k, v in m.state_dict().items() if k != "lm_head.weight"}
    st_write(d + "/init.safetensors", sd)
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, V, (3000,), generator=g).tolist()
    open(d + "/tokens.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))
else:  # check: step-1 loss and gradients against mge's
    mge_loss, tol = float(sys.argv[4]), 1e-4
    ids = list(struct.unpack("<3000H", open(d + "/tokens.bin", "rb").read()))
    starts = [window(len(ids), 0, r) for r in range(B)]
    x = torch.tensor([ids[s:s + T] for s in starts]); y = torch.tensor([ids[s + 1:s + T + 1] for s in starts])
    m = TorchGPT(L, H, C, T, V); sd0 = st_read(d + "/init.safetensors")
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

BENCH=$(cd "$(dirname "$0")/../bench" && pwd)
$PY "$T/ref.py" make "$T" "$BENCH" || { echo "FAIL: torch reference setup"; exit 1; }
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
$PY "$T/ref.py" check "$T" "$BENCH" "$loss1"
