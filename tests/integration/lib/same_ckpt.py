"""same_ckpt.py A B: checkpoint files A (device cpu) and B (device sim) equal byte for byte past
their 24-byte header (which holds the payload's CRC), except that the spec text B carries says
"device: sim" where A's says "device: cpu". Prints the payload size; exits 1 naming the first
difference otherwise."""
import sys

a = open(sys.argv[1], "rb").read()[24:]
b = open(sys.argv[2], "rb").read()[24:].replace(b"device: sim", b"device: cpu")
if len(a) < 1000 or a != b:
    first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), "the end")
    sys.exit("%d and %d bytes, first difference at %s" % (len(a), len(b), first))
print(len(a))
