#!/usr/bin/python3
"""unit_exec.py: run a systemd unit's ExecStart= the way systemd would, without systemd.

usage: unit_exec.py UNIT BINDIR CRED_DIR STATE_ROOT HOSTNAME [ENVFILE...] [-- EXTRA_ARG...]

Reads UNIT's [Service] section: Environment= (in order), then each EnvironmentFile= named
by the unit is replaced by the ENVFILE arguments (read in order, later ones win), then
ExecStart= (continuation lines joined). Expands the specifiers %d (CRED_DIR: the
credentials directory, where LoadCredential= puts its copies), %S (STATE_ROOT), %H
(HOSTNAME) and %%; then "${NAME}" as one word and "$NAME" as whitespace-split words, as
systemd.service(5) describes. The binary's directory is replaced by BINDIR. Then it execs
the command with the unit's environment added to its own (so the caller's $! is the daemon).
With MGE_UNIT_PRINT=1 it prints the final argv, one word per line, instead.
"""
import os
import re
import sys


def fail(msg):
    sys.stderr.write("unit_exec: %s\n" % msg)
    sys.exit(2)


def unit_lines(path):
    """(section, key, value) for every assignment, continuation lines joined."""
    out, section, cur = [], None, ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not cur and (not line.strip() or line.lstrip()[:1] in "#;"):
                continue
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            line = cur + line
            cur = ""
            if line.startswith("["):
                section = line.strip("[] ")
                continue
            key, _, val = line.partition("=")
            out.append((section, key.strip(), val.strip()))
    return out


def specifiers(s, spec):
    def sub(m):
        c = m.group(1)
        if c not in spec:
            fail("specifier %%%s is not handled here" % c)
        return spec[c]
    return re.sub(r"%(.)", sub, s)


def env_file(path, env):
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if "=" not in line:
                fail("%s:%d: expected NAME=value" % (path, n))
            k, _, v = line.partition("=")
            v = v.strip()
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            env[k.strip()] = v


def main():
    args = sys.argv[1:]
    extra = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1:]
    if len(args) < 5:
        fail("usage: unit_exec.py UNIT BINDIR CRED_DIR STATE_ROOT HOSTNAME [ENVFILE...] [-- ARG...]")
    unit, bindir, cred, state, host = args[:5]
    spec = {"d": cred, "S": state, "H": host, "%": "%"}
    env, execs = {}, []
    for section, key, val in unit_lines(unit):
        if section != "Service":
            continue
        if key == "Environment":
            for word in val.split():
                k, _, v = specifiers(word, spec).partition("=")
                env[k] = v
        elif key == "EnvironmentFile":
            for path in args[5:]:
                env_file(path, env)
        elif key == "ExecStart":
            execs.append(val)
    if len(execs) != 1:
        fail("%s: expected one ExecStart=, found %d" % (unit, len(execs)))
    argv = []
    for word in specifiers(execs[0], spec).split():
        m = re.fullmatch(r"\$(\w+)", word)
        if m:
            argv += env.get(m.group(1), "").split()
            continue
        argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    argv[0] = os.path.join(bindir, os.path.basename(argv[0]))
    argv += extra
    if os.environ.get("MGE_UNIT_PRINT"):
        print("\n".join(argv))
        return
    os.execve(argv[0], argv, dict(os.environ, **env))


main()
