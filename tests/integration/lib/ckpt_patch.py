#!/usr/bin/env python3
"""ckpt_patch.py: overwrite one float32 of one tensor in an mge checkpoint, keeping the file
valid (the CRC is recomputed), so tests can hand a reader a well-formed checkpoint with a bad
value in it.

usage: ckpt_patch.py IN OUT TENSOR INDEX VALUE   (VALUE: a float, 'nan' or 'inf')
Layout (engine/ckpt.h): 24-byte header "MGECKPT1", payload length u64 LE, CRC-32 u32 LE,
4 zero bytes; then mge.ckpt.Checkpoint (proto/checkpoint.proto): tensors = 11, each a Tensor
with name = 1 and data = 4. The value keeps its size, so no length changes anywhere.
"""
import struct
import sys
import zlib


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b, start, end):
    """(field number, wire type, value start, value end) of each field in b[start:end]."""
    i = start
    while i < end:
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, j = varint(b, i)
        elif wt == 1:
            j = i + 8
        elif wt == 5:
            j = i + 4
        elif wt == 2:
            n, i = varint(b, i)
            j = i + n
        else:
            raise SystemExit("ckpt_patch: unsupported wire type %d" % wt)
        yield num, wt, i, j
        i = j


def main():
    src, dst, name, index, value = sys.argv[1:6]
    b = bytearray(open(src, "rb").read())
    if b[:8] != b"MGECKPT1":
        raise SystemExit("ckpt_patch: %s: not an mge checkpoint" % src)
    n = struct.unpack_from("<Q", b, 8)[0]
    for num, wt, s, e in fields(b, 24, 24 + n):
        if num != 11 or wt != 2:
            continue
        tname = data = None
        for fn, fwt, fs, fe in fields(b, s, e):
            if fn == 1:
                tname = bytes(b[fs:fe]).decode()
            elif fn == 4:
                data = (fs, fe)
        if tname == name:
            at = data[0] + 4 * int(index)
            if at + 4 > data[1]:
                raise SystemExit("ckpt_patch: %s has no float %s" % (name, index))
            struct.pack_into("<f", b, at, float(value))
            struct.pack_into("<I", b, 16, zlib.crc32(bytes(b[24 : 24 + n])) & 0xFFFFFFFF)
            open(dst, "wb").write(b)
            return
    raise SystemExit("ckpt_patch: %s: no tensor '%s'" % (src, name))


main()
