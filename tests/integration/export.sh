#!/bin/sh
# export.sh: weights out and in. mge-export writes a trained MLP checkpoint as safetensors;
# a hand-written reader (json + struct) loads it into the MLP's forward pass (PyTorch's
# nn.Module with load_state_dict(strict=True) when /usr/bin/python3 has torch, pure Python
# otherwise) and matches mge-infer's loss; mge-train --init-from that file starts exactly where
# --init-from the checkpoint does; weights written in Python (or initialised by torch) give
# mge-train the step-1 loss Python computes; a ResNet round-trips with torchvision's names;
# bad files and flags exit 2 naming the file and tensor.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)
# step1 FILE: the loss of step 1
step1() { python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1]) if l.startswith("{\"step\":1,")][0])' "$1"; }
# expect_2 NAME TEXT CMD...: CMD exits 2 and its stderr contains TEXT
expect_2() {
    name=$1; text=$2; shift 2
    "$@" > "$T/x.out" 2> "$T/x.err"; rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$text" "$T/x.err"; then ok "$name: exit 2, '$(head -n 1 "$T/x.err")'"
    else bad "$name: exit $rc, stderr '$(cat "$T/x.err")' lacks '$text'"; fi
}

D=/usr/share/datasets/fashion-mnist
if [ ! -f $D/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# the hand-written safetensors reader and writer the checks below share
cat > "$T/st.py" <<'PY'
import gzip, json, math, struct, sys

def st_read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    hdr = json.loads(data[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    out = {}
    for name, e in hdr.items():
        assert e["dtype"] in ("F32", "I64"), e["dtype"]
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        out[name] = (e["shape"], raw, e["dtype"])
    return meta, out

def st_write(path, tensors):  # tensors: [(name, shape, raw bytes, dtype)]
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, raw, dt in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(t[2] for t in tensors))

def idx(path):
    d = gzip.open(path).read()
    nd = d[3]
    dims = [struct.unpack(">I", d[4 + 4 * i:8 + 4 * i])[0] for i in range(nd)]
    return dims, d[4 + 4 * nd:]

def small_test(src_images, src_labels, n, out_images, out_labels):
    for src, out, per in ((src_images, out_images, 784), (src_labels, out_labels, 1)):
        d = gzip.open(src).read()
        nd = d[3]
        head = bytearray(d[:4 + 4 * nd])
        head[4:8] = struct.pack(">I", n)
        with gzip.open(out, "wb") as f:
            f.write(bytes(head) + d[4 + 4 * nd:4 + 4 * nd + n * per])

def floats(raw):
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))

def mlp_loss_pure(st, images, labels):
    """Mean cross-entropy of the 784-512-512-10 ReLU MLP, in double precision."""
    (_, xs), (_, ys) = idx(images), idx(labels)
    layers = []
    for i in (1, 2, 3):
        (o, k), w = st["fc%d.weight" % i][0], floats(st["fc%d.weight" % i][1])
        layers.append(([w[r * k:(r + 1) * k] for r in range(o)], floats(st["fc%d.bias" % i][1])))
    total = 0.0
    for s in range(len(ys)):
        h = [v / 255.0 for v in xs[784 * s:784 * (s + 1)]]
        for li, (w, b) in enumerate(layers):
            h = [sum(map(float.__mul__, row, h)) + bb for row, bb in zip(w, b)]
            if li < 2:
                h = [v if v > 0 else 0.0 for v in h]
        m = max(h)
        total += m + math.log(sum(math.exp(v - m) for v in h)) - h[ys[s]]
    return total / len(ys)

def mlp_loss_torch(st, images, labels):
    import torch, torch.nn as nn
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)
        def forward(self, x):
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))
    m = MLP()
    dt = {"F32": torch.float32, "I64": torch.int64}
    m.load_state_dict({k: torch.frombuffer(bytearray(raw), dtype=dt[d]).reshape(shape)
                       for k, (shape, raw, d) in st.items()}, strict=True)
    (_, xs), (_, ys) = idx(images), idx(labels)
    x = torch.tensor(list(xs), dtype=torch.float32).reshape(-1, 784) / 255.0
    y = torch.tensor(list(ys), dtype=torch.int64)
    with torch.no_grad():
        return nn.functional.cross_entropy(m(x), y).item()

if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "small":
        small_test(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:7])
    elif cmd == "names":
        meta, st = st_read(sys.argv[2])
        print(" ".join("%s%s" % (k, v[0]) for k, v in sorted(st.items())).replace(" ", ""), meta.get("format"))
    elif cmd in ("pure", "torch"):
        st = st_read(sys.argv[2])[1]
        f = mlp_loss_pure if cmd == "pure" else mlp_loss_torch
        print("%.9g" % f(st, sys.argv[3], sys.argv[4]))
    elif cmd == "random":  # random OUT SEED: a 784-512-512-10 MLP, uniform weights at three
        # times nn.Linear's bound, so that its loss is far from a fresh init's ~ln 10
        import random
        rng, ts = random.Random(int(sys.argv[3])), []
        for i, (o, k) in enumerate(((512, 784), (512, 512), (10, 512)), 1):
            bound = 3 / math.sqrt(k)
            for name, shape in (("fc%d.weight" % i, [o, k]), ("fc%d.bias" % i, [o])):
                n = o * (k if len(shape) == 2 else 1)
                vals = [rng.uniform(-bound, bound) for _ in range(n)]
                ts.append((name, shape, struct.pack("<%df" % n, *vals), "F32"))
        st_write(sys.argv[2], ts)
    elif cmd == "torch_random":  # torch_random OUT IMAGES LABELS SEED: torch's init, by hand
        import torch, torch.nn as nn
        torch.manual_seed(int(sys.argv[5]))
        m = nn.Module()
        m.fc1, m.fc2, m.fc3 = nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)
        st_write(sys.argv[2], [(k, list(v.shape), struct.pack("<%df" % v.numel(), *v.flatten().tolist()),
                                "F32") for k, v in m.state_dict().items()])
        print("%.9g" % mlp_loss_torch(st_read(sys.argv[2])[1], sys.argv[3], sys.argv[4]))
    elif cmd == "edit":  # edit IN OUT drop:NAME | add:NAME | reshape:NAME
        st = st_read(sys.argv[2])[1]
        op, name = sys.argv[4].split(":")
        ts = [(k, s, r, d) for k, (s, r, d) in st.items() if not (op == "drop" and k == name)]
        if op == "add":
            ts.append((name, [3], b"\0" * 12, "F32"))
        if op == "reshape":
            ts = [(k, [s[1], s[0]] if k == name else s, r, d) for k, s, r, d in ts]
        st_write(sys.argv[3], ts)
PY

spec="$ROOT/examples/fmnist-mlp.yaml"
python3 "$T/st.py" small $D/t10k-images-idx3-ubyte.gz $D/t10k-labels-idx1-ubyte.gz 32 \
    "$T/small-images.gz" "$T/small-labels.gz" || bad "cannot make the 32-sample test set"
small="--set data.test_images=$T/small-images.gz --set data.test_labels=$T/small-labels.gz"

echo "-- train an MLP 40 steps, export it"
# shellcheck disable=SC2086 # $small is two flags
"$BIN/mge-train" "$spec" $small --set train.steps=40 --set train.checkpoint_every=0 --json \
    --out "$T/a" > "$T/a.out" 2>"$T/err" || { bad "mge-train exited $?"; cat "$T/err"; }
ck="$T/a/latest.mgeckpt"
"$BIN/mge-export" "$ck" --format safetensors --output "$T/w.safetensors" 2>"$T/err" &&
    ok "mge-export wrote $(wc -c < "$T/w.safetensors") bytes" || { bad "mge-export exited $?"; cat "$T/err"; }
names=$(python3 "$T/st.py" names "$T/w.safetensors")
want="fc1.bias[512]fc1.weight[512,784]fc2.bias[512]fc2.weight[512,512]fc3.bias[10]fc3.weight[10,512] pt"
[ "$names" = "$want" ] && ok "PyTorch's names and shapes, no optimiser state: $names" || bad "names '$names' != '$want'"

echo "-- the file's weights give mge-infer's loss"
"$BIN/mge-infer" "$ck" --json > "$T/infer.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
iloss=$(json "$T/infer.out" loss)
close() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) + 1e-6 else 1)' "$1" "$2"; }
ploss=$(python3 "$T/st.py" pure "$T/w.safetensors" "$T/small-images.gz" "$T/small-labels.gz")
close "$ploss" "$iloss" && ok "hand-parsed file, forward in Python: loss $ploss == mge-infer's $iloss (1e-5 rel; mge-infer prints 6 decimals)" ||
    bad "Python forward loss $ploss != mge-infer's $iloss"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    tloss=$(/usr/bin/python3 "$T/st.py" torch "$T/w.safetensors" "$T/small-images.gz" "$T/small-labels.gz")
    close "$tloss" "$iloss" && ok "torch load_state_dict(strict=True): loss $tloss == mge-infer's $iloss" ||
        bad "torch loss $tloss != mge-infer's $iloss"
else
    echo "  skipped: no torch (the torch.nn.Module load_state_dict check)"
fi

echo "-- --init-from: the exported file starts where the checkpoint's weights do"
run() { # out-name, extra flags...
    n=$1; shift
    # shellcheck disable=SC2086
    "$BIN/mge-train" "$spec" $small --set train.steps=5 --set train.checkpoint_every=0 --json \
        --out "$T/$n" "$@" > "$T/$n.out" 2>"$T/$n.err" || { bad "$n: mge-train exited $?"; cat "$T/$n.err"; }
}
run st --init-from "$T/w.safetensors"
run ck --init-from "$ck"
run fresh
s1=$(step1 "$T/st.out"); c1=$(step1 "$T/ck.out"); f1=$(step1 "$T/fresh.out")
[ -n "$s1" ] && [ "$s1" = "$c1" ] && ok "step-1 loss $s1 from safetensors == $c1 from the checkpoint" || bad "step-1 loss $s1 != $c1"
[ "$(json "$T/st.out" final_loss)" = "$(json "$T/ck.out" final_loss)" ] && ok "and after 5 steps: $(json "$T/st.out" final_loss) both" ||
    bad "final loss $(json "$T/st.out" final_loss) != $(json "$T/ck.out" final_loss)"
python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) - 0.5 else 1)' "$s1" "$f1" &&
    ok "trained weights loaded: step-1 loss $s1, fresh weights $f1" || bad "step-1 loss $s1 vs fresh $f1: weights not loaded?"
[ "$(json "$T/st.out" steps_run)" = 5 ] && ok "fresh run from step 0 (5 steps run)" || bad "steps_run $(json "$T/st.out" steps_run)"

echo "-- the other way: weights written in Python, step 1 of mge-train --init-from"
# a 32-sample training set and batch 32: step 1's loss is the mean over exactly these samples
python3 "$T/st.py" small $D/train-images-idx3-ubyte.gz $D/train-labels-idx1-ubyte.gz 32 \
    "$T/tr-images.gz" "$T/tr-labels.gz" || bad "cannot make the 32-sample training set"
tiny="--set data.train_images=$T/tr-images.gz --set data.train_labels=$T/tr-labels.gz --set train.batch_size=32"
python3 "$T/st.py" random "$T/py.st" 7
ploss=$(python3 "$T/st.py" pure "$T/py.st" "$T/tr-images.gz" "$T/tr-labels.gz")
# shellcheck disable=SC2086
run py $tiny --init-from "$T/py.st"
mloss=$(step1 "$T/py.out")
close "$mloss" "$ploss" && ok "Python-written weights: mge-train's step-1 loss $mloss == Python's $ploss (1e-5 rel)" ||
    bad "Python-written weights: step-1 loss $mloss != Python's $ploss"
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    tloss=$(/usr/bin/python3 "$T/st.py" torch_random "$T/torch.st" "$T/tr-images.gz" "$T/tr-labels.gz" 3)
    # shellcheck disable=SC2086
    run torch $tiny --init-from "$T/torch.st"
    mloss=$(step1 "$T/torch.out")
    close "$mloss" "$tloss" && ok "torch-initialised weights: step-1 loss $mloss == torch's $tloss" ||
        bad "torch-initialised weights: step-1 loss $mloss != torch's $tloss"
else
    echo "  skipped: no torch (torch initialises, mge-train --init-from matches its loss)"
fi

echo "-- resnet (depth 8): torchvision's names, batch norm's buffers and counters, and back"
rspec="$ROOT/examples/fmnist-resnet20.yaml"
rrun() { # out-name, steps, extra flags...
    n=$1; st=$2; shift 2
    # shellcheck disable=SC2086
    "$BIN/mge-train" "$rspec" $small --set model.depth=8 --set train.batch_size=16 --set train.steps=$st \
        --set train.checkpoint_every=0 --json --out "$T/$n" "$@" > "$T/$n.out" 2>"$T/$n.err" ||
        { bad "$n: mge-train exited $?"; cat "$T/$n.err"; }
}
rrun r 3
"$BIN/mge-export" "$T/r/latest.mgeckpt" --format safetensors --output "$T/r.st" 2>"$T/err" || { bad "mge-export resnet exited $?"; cat "$T/err"; }
rn=$(python3 "$T/st.py" names "$T/r.st")
for want in "conv1.weight[16,1,3,3]" "bn1.running_var[16]" "bn1.num_batches_tracked[]" \
    "layer2.0.downsample.0.weight[32,16,1,1]" "layer3.0.downsample.1.running_mean[64]" "fc.weight[10,64]"; do
    case $rn in *"$want"*) ok "resnet file has $want" ;; *) bad "resnet file lacks $want: $rn" ;; esac
done
rrun rst 2 --init-from "$T/r.st"
rrun rck 2 --init-from "$T/r/latest.mgeckpt"
a=$(step1 "$T/rst.out"); b=$(step1 "$T/rck.out")
[ -n "$a" ] && [ "$a" = "$b" ] && ok "resnet step-1 loss $a from safetensors == $b from the checkpoint" || bad "resnet step-1 loss $a != $b"
a=$(json "$T/rst.out" test_loss); b=$(json "$T/rck.out" test_loss)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "resnet test loss (running statistics) $a == $b" || bad "resnet test loss $a != $b"

echo "-- bad input: exit 2 naming the file and the tensor"
expect_2 "export: no checkpoint" "$T/none.mgeckpt" "$BIN/mge-export" "$T/none.mgeckpt" --format safetensors --output "$T/o"
head -c 1000 "$ck" > "$T/trunc.mgeckpt"
expect_2 "export: truncated checkpoint" "$T/trunc.mgeckpt" "$BIN/mge-export" "$T/trunc.mgeckpt" --format safetensors --output "$T/o"
expect_2 "export: unknown format" "unknown format 'onnx'" "$BIN/mge-export" "$ck" --format onnx --output "$T/o"
expect_2 "export: unwritable output" "$T/no/dir/o" "$BIN/mge-export" "$ck" --format safetensors --output "$T/no/dir/o"
python3 "$T/st.py" edit "$T/w.safetensors" "$T/extra.st" add:extra.weight
python3 "$T/st.py" edit "$T/w.safetensors" "$T/drop.st" drop:fc2.bias
python3 "$T/st.py" edit "$T/w.safetensors" "$T/shape.st" reshape:fc1.weight
expect_2 "init-from: extra tensor" "tensor 'extra.weight' (shape [3]) is not a parameter" "$BIN/mge-train" "$spec" --init-from "$T/extra.st" --out "$T/e"
expect_2 "init-from: missing tensor" "tensor 'fc2.bias' (shape [512]) is missing" "$BIN/mge-train" "$spec" --init-from "$T/drop.st" --out "$T/e"
expect_2 "init-from: wrong shape" "tensor 'fc1.weight': the model expects float32 [512, 784], the file has [784, 512]" \
    "$BIN/mge-train" "$spec" --init-from "$T/shape.st" --out "$T/e"
expect_2 "init-from: another model" "tensor 'fc1.w': the model expects float32 [256, 784], the file has [512, 784]" \
    "$BIN/mge-train" "$spec" --set "model.hidden=[256,256]" --init-from "$ck" --out "$T/e"
head -c 3000 "$T/w.safetensors" > "$T/trunc.st"
expect_2 "init-from: truncated safetensors" "$T/trunc.st: tensor" "$BIN/mge-train" "$spec" --init-from "$T/trunc.st" --out "$T/e"
printf 'not a weights file at all' > "$T/junk.st"
expect_2 "init-from: junk" "$T/junk.st: header length" "$BIN/mge-train" "$spec" --init-from "$T/junk.st" --out "$T/e"
expect_2 "init-from: no file" "cannot open '$T/none.st'" "$BIN/mge-train" "$spec" --init-from "$T/none.st" --out "$T/e"
expect_2 "init-from with resume" "exclude each other" "$BIN/mge-train" "$spec" --init-from "$ck" --resume "$ck"

echo "export: $passes passed, $fails failed"
[ $fails -eq 0 ]
