#!/bin/sh
# train_resnet.sh: the torchvision ResNet variants (model.variant resnet18 ... resnet152).
# A narrow ResNet-18 with the ImageNet stem trains on 1x28x28 images and mge-infer reproduces
# its evaluation; a ResNet-50 trains bit-identically with sublinear memory; bad keys exit 2.
# With PyTorch (/usr/bin/python3), against torchvision's layout written out in lib/tv_resnet.py: the
# exported safetensors names and shapes equal the torch model's state_dict, and from weights
# torch initialised (--init-from) the step-1 loss, every gradient, the running statistics and
# the evaluation after one step equal PyTorch's (ResNet-18 and ResNet-50, both stems).
. "$(dirname "$0")/lib/train.sh"
LIB=$(cd "$(dirname "$0")/lib" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "-- ResNet-18 (ImageNet stem, width 8) on 1x28x28 trains; mge-infer agrees"
cat > "$T/r18.yaml" <<'Y'
name: r18
model: {type: resnet, variant: resnet18, width: 8}
data: {format: synthetic, image: [1, 28, 28], classes: 10, train_size: 480, test_size: 128}
train:
  steps: 30
  batch_size: 32
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
  seed: 3
Y
"$BIN/mge-train" "$T/r18.yaml" --json --out "$T/r18" > "$T/r18.out" 2>"$T/err" || { bad "resnet18 exited $?"; cat "$T/err"; }
first=$(grep -m1 '"step":1,' "$T/r18.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
last=$(json "$T/r18.out" final_loss); acc=$(json "$T/r18.out" test_accuracy)
lt "$last" "$(python3 -c "print($first / 2)")" && ok "resnet18 loss $first -> $last, test accuracy $acc" || bad "resnet18 loss $first -> $last"
"$BIN/mge-infer" "$T/r18/latest.mgeckpt" --json > "$T/i.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
[ "$(json "$T/i.out" accuracy)" = "$acc" ] && ok "mge-infer accuracy $acc == training's" || bad "mge-infer $(json "$T/i.out" accuracy) != $acc"

echo "-- ResNet-50 (width 4) on 3x32x32: sublinear memory keeps less and changes no bit"
R50="--set model.variant=resnet50 --set model.width=4 --set data.image=[3,32,32] --set train.steps=3"
# shellcheck disable=SC2086
"$BIN/mge-train" "$T/r18.yaml" $R50 --json --out "$T/r50" > "$T/r50.out" 2>"$T/err" || { bad "resnet50 exited $?"; cat "$T/err"; }
# shellcheck disable=SC2086
"$BIN/mge-train" "$T/r18.yaml" $R50 --set memory.sublinear=true --json --out "$T/r50s" > "$T/r50s.out" 2>"$T/err" || { bad "resnet50 sublinear exited $?"; cat "$T/err"; }
for k in final_loss test_loss; do
    v1=$(json "$T/r50.out" $k); v2=$(json "$T/r50s.out" $k)
    [ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "resnet50 $k $v1 plain == $v2 sublinear" || bad "resnet50 $k $v1 plain != $v2 sublinear"
done
# shellcheck disable=SC2086
"$BIN/mge-train" --plan "$T/r18.yaml" $R50 --set memory.sublinear=true > "$T/plan.json" 2>&1
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plans"]; print(p["plain"]["activation_bytes"], p["sublinear"]["activation_bytes"]); sys.exit(0 if p["sublinear"]["activation_bytes"] < p["plain"]["activation_bytes"] else 1)' "$T/plan.json" > "$T/plan.txt" \
    && ok "resnet50 --plan: activations plain, sublinear: $(cat "$T/plan.txt")" || bad "resnet50 plan: $(cat "$T/plan.json")"

echo "-- bad keys exit 2 naming the key and line"
expect2 "unknown variant" "model.variant" "$BIN/mge-train" "$T/r18.yaml" --set model.variant=resnet19
expect2 "depth with a variant" "model.depth" "$BIN/mge-train" "$T/r18.yaml" --set model.depth=20

if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "skip - PyTorch parity: /usr/bin/python3 has no torch"
    echo "train_resnet: $passes passed, $fails failed"
    [ $fails -eq 0 ]; exit
fi

echo "-- PyTorch parity: names, step-1 loss, gradients, running statistics"
# par.py init|check LIB CFGS: for each line "variant stem c h w DIR" of file CFGS torch builds
# torchvision's model (width 8, 5 classes). init writes its initial weights (state_dict, as
# safetensors) and a batch (.npy) into DIR; check compares, against a float64 copy of the torch
# model on the same batch: the names and shapes mge exports; the step-1 loss (within 1e-4); the
# gradients, read from the weights after one SGD step (lr 0.01: (w0 - w1) / 0.01, less the
# rounding of w1), each within 1e-3 of its largest element or no further off than twice the
# worst of PyTorch's own float32 run (batch norms over tiny maps are ill-conditioned); the
# running statistics after the step; and mge's evaluation of the batch after the step with
# torch's eval mode. One line per CFG ("ok ..." or "FAIL ...").
cat > "$T/par.py" <<'PY'
import copy, json, struct, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
from tv_resnet import resnet

def st_read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n]); hdr.pop("__metadata__", None)
    dt = {"F32": np.float32, "I64": np.int64}
    return {k: np.frombuffer(data[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][1]],
                             dtype=dt[e["dtype"]]).reshape(e["shape"]) for k, e in hdr.items()}

def st_write(path, sd):
    hdr, raws, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k, t in sd.items():
        a = t.detach().numpy()
        raw = a.astype("<f4" if a.dtype == np.float32 else "<i8").tobytes()
        hdr[k] = {"dtype": "F32" if a.dtype == np.float32 else "I64", "shape": list(a.shape),
                  "data_offsets": [off, off + len(raw)]}
        raws.append(raw); off += len(raw)
    hb = json.dumps(hdr).encode(); hb += b" " * (-len(hb) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + b"".join(raws))

def check(m, d):
    w1, sd = st_read(d + "/w1.st"), m.state_dict()
    assert sorted(w1) == sorted(sd), "names differ: only mge %s, only torch %s" % (
        sorted(set(w1) - set(sd))[:5], sorted(set(sd) - set(w1))[:5])
    for k, t in sd.items():
        assert list(w1[k].shape) == list(t.shape), "%s: mge %s, torch %s" % (k, w1[k].shape, list(t.shape))
    w0 = {k: v.detach().numpy().astype(np.float64) for k, v in sd.items()}
    x, y = torch.from_numpy(np.load(d + "/x.npy")), torch.from_numpy(np.load(d + "/y.npy"))
    # the reference is float64; PyTorch's own float32 run shows how far rounding alone goes
    m32 = copy.deepcopy(m)
    m = m.double()
    for mm, xx in ((m32, x), (m, x.double())):
        mm.train()
        loss = torch.nn.functional.cross_entropy(mm(xx), y)
        loss.backward()
    mloss = float(open(d + "/loss").read())
    assert abs(mloss - loss.item()) <= 1e-4 * abs(loss.item()), "loss mge %.9g torch %.9g" % (mloss, loss.item())
    errs, p32 = [], dict(m32.named_parameters())
    for k, p in m.named_parameters():
        g_t = p.grad.numpy()
        scale = np.abs(g_t).max() + 1e-12
        # w1 = w0 - 0.01 g rounds to float32: (w0 - w1) / 0.01 carries up to ulp(w1) / 0.01
        rounding = np.abs(w1[k]).max() * 2.0 ** -23 / 0.01
        errs.append((max(np.abs((w0[k] - w1[k]) / 0.01 - g_t).max() - rounding, 0.0) / scale, k,
                     np.abs(p32[k].grad.numpy() - g_t).max() / scale))
    worst, worst_k, _ = max(errs)
    worst32 = max(e[2] for e in errs)
    # within 1e-3 of the exact gradient, or (batch norms over tiny maps are ill-conditioned)
    # no further off than twice the worst tensor of PyTorch's own float32 run
    assert worst <= max(1e-3, 2 * worst32), "gradient of %s: relative error %.3g (torch float32: worst %.3g)" % (worst_k, worst, worst32)
    worst_k = "%s; torch float32 worst %.2g" % (worst_k, worst32)
    for k, b in m.named_buffers():
        if not k.endswith("num_batches_tracked"):
            e = np.abs(w1[k] - b.numpy()).max() / (np.abs(b.numpy()).max() + 1e-12)
            assert e <= 1e-4, "%s: relative error %.3g" % (k, e)
    # inference: mge's evaluation of the same batch with the stepped weights and running
    # statistics (test_loss, 6 decimals) is torch's in eval mode
    m.load_state_dict({k: torch.from_numpy(v.astype(np.float64) if v.dtype == np.float32 else v.copy())
                       for k, v in w1.items()})
    m.eval()
    with torch.no_grad():
        tloss = torch.nn.functional.cross_entropy(m(x.double()), y).item()
    eloss = float(open(d + "/test_loss").read())
    assert abs(eloss - tloss) <= 1e-4 * abs(tloss) + 1e-6, "eval loss mge %.9g torch %.9g" % (eloss, tloss)
    return "%d tensors named alike, loss %.7g (float64 torch %.7g), %d gradients within %.2g (worst %s), eval loss %.6f (torch %.6f)" % (
        len(sd), mloss, loss.item(), len(list(m.parameters())), worst, worst_k, eloss, tloss)

for cfg in open(sys.argv[3]).read().splitlines():
    variant, stem, c, h, w, d = cfg.split()
    c, h, w = int(c), int(h), int(w)
    torch.manual_seed(4)
    m = resnet(variant, num_classes=5, in_ch=c, width=8, cifar_stem=stem == "cifar")
    if sys.argv[1] == "init":
        g = np.random.default_rng(7)
        np.save(d + "/x.npy", g.random((24, c, h, w), dtype=np.float32))
        np.save(d + "/y.npy", (np.arange(24) % 5).astype(np.int64))
        st_write(d + "/w0.st", m.state_dict())
        continue
    try:
        print("ok %s (%s stem, %dx%dx%d): %s" % (variant, stem, c, h, w, check(m, d)))
    except (AssertionError, OSError, ValueError) as e:
        print("FAIL %s (%s stem): %s" % (variant, stem, e))
PY
for cfg in "resnet18 imagenet 3 32 32" "resnet50 imagenet 3 32 32" "resnet18 cifar 1 28 28" "resnet50 cifar 1 16 16"; do
    D="$T/$(echo "$cfg" | tr ' ' -)"; mkdir -p "$D"
    echo "$cfg $D"
done > "$T/cfgs"
/usr/bin/python3 "$T/par.py" init "$LIB" "$T/cfgs" 2>"$T/err" || { bad "torch init failed"; cat "$T/err"; }
while read -r variant stem c h w D; do
    cat > "$D/spec.yaml" <<Y
name: par
model: {type: resnet, variant: $variant, stem: $stem, width: 8}
data: {format: npy, train_images: $D/x.npy, train_labels: $D/y.npy, test_images: $D/x.npy,
       test_labels: $D/y.npy, image: [$c, $h, $w], classes: 5}
train:
  steps: 1
  batch_size: 24
  optimizer: {type: sgd, lr: 0.01}
Y
    "$BIN/mge-train" "$D/spec.yaml" --init-from "$D/w0.st" --json --out "$D/run" > "$D/run.out" 2>"$T/err" || { bad "$variant $stem: mge-train exited $?"; cat "$T/err"; continue; }
    json "$D/run.out" final_loss > "$D/loss"
    json "$D/run.out" test_loss > "$D/test_loss"
    "$BIN/mge-export" "$D/run/latest.mgeckpt" --format safetensors --output "$D/w1.st" 2>"$T/err" || { bad "$variant $stem: mge-export exited $?"; cat "$T/err"; }
done < "$T/cfgs"
/usr/bin/python3 "$T/par.py" check "$LIB" "$T/cfgs" > "$T/par.out" 2>&1
while read -r verdict line; do
    case $verdict in ok) ok "$line" ;; *) bad "$verdict $line" ;; esac
done < "$T/par.out"
[ "$(grep -c '^ok ' "$T/par.out")" = 4 ] || bad "parity: $(cat "$T/par.out")"

echo "train_resnet: $passes passed, $fails failed"
[ $fails -eq 0 ]
