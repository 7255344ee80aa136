#!/bin/sh
# deploy_k8s.sh: the Kubernetes manifests in deploy/k8s/ validate offline. What is checked
# (no API server here, so no `kubectl create --dry-run=client`: that asks a server for its
# resource list and schema): `kubectl kustomize deploy/k8s` builds the set (YAML, the
# kustomization, every resource found); tests/integration/lib/k8s_check.py checks every
# object against the typed models of python3-kubernetes (field names at every depth, value
# types, required fields) and the references between them (selectors, ports, volumes,
# Secret keys, the StatefulSet's headless Service, probes on a token-free GET route of
# docs/api/openapi.yaml); three broken copies show that it fails; and every MGE_* variable
# the manifests set is one deploy/container/entrypoint.sh reads.
# Skips visibly without python3-yaml/python3-kubernetes; the kubectl step without kubectl.
PY=/usr/bin/python3
K8S=deploy/k8s
[ -x $PY ] && $PY -c 'import yaml, kubernetes' 2>/dev/null ||
    { echo "SKIP: python3-yaml and python3-kubernetes are needed (deploy/install-deps.sh)"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/mge-k8s.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok()   { echo "ok   - $*"; }
fail() { echo "FAIL - $*"; fails=$((fails + 1)); }
MANIFESTS=$(sed -n 's/^  - \(.*\.yaml\)$/\1/p' $K8S/kustomization.yaml)
set --
for m in $MANIFESTS; do set -- "$@" "$K8S/$m"; done
n_files=$(ls $K8S/*.yaml | grep -vc kustomization)
[ $# -eq "$n_files" ] && ok "kustomization lists all $# manifests" ||
    fail "kustomization lists $# of $n_files manifests"

if command -v kubectl >/dev/null 2>&1; then
    if kubectl kustomize $K8S >"$T/all.yaml" 2>"$T/kz.err"; then
        kinds=$(grep '^kind:' "$T/all.yaml" | sort | uniq -c | awk '{printf "%s %s, ", $1, $3}')
        ok "kubectl kustomize builds: ${kinds%, }"
        set -- "$T/all.yaml"  # check what kubectl built, not only our files
    else
        fail "kubectl kustomize: $(cat "$T/kz.err")"
    fi
else
    echo "note: kubectl not installed: kustomize build skipped"
fi

if $PY tests/integration/lib/k8s_check.py docs/api/openapi.yaml "$@" >"$T/check.out" 2>&1; then
    ok "k8s_check: $(grep -c '^ok' "$T/check.out") objects valid against the API's models, references resolve"
else
    fail "k8s_check:"; cat "$T/check.out"
fi

# the check can fail: a misspelt field, a Secret key that does not exist, a probe on a route
# that needs a token
bad() { # description, sed expression, file
    sed "$2" "$K8S/$3" >"$T/bad.yaml"
    if $PY tests/integration/lib/k8s_check.py docs/api/openapi.yaml "$K8S/secret.example.yaml" \
        "$T/bad.yaml" >"$T/bad.out" 2>&1; then
        fail "k8s_check accepted $1"
    else
        ok "k8s_check refuses $1: $(grep -m1 '^error' "$T/bad.out" | cut -c8-130)"
    fi
}
bad "a misspelt field" 's/^  serviceName:/  servicename:/' coordinator.yaml
bad "a missing Secret key" 's/key: join$/key: joinx/' worker-daemonset.yaml
bad "a probe that needs a token" 's|path: /healthz|path: /api/v1/jobs|' coordinator.yaml

# the image's entrypoint reads every MGE_* variable the manifests set
for v in $(grep -ho 'name: MGE_[A-Z_]*' $K8S/*.yaml | sed 's/name: //' | sort -u); do
    [ "$v" = MGE_LOG ] && continue  # read by the daemons themselves
    grep -q "\$$v\|\${$v" deploy/container/entrypoint.sh || fail "entrypoint.sh does not read $v"
done

if [ "$fails" -eq 0 ]; then echo "deploy_k8s: all passed"; exit 0; fi
echo "deploy_k8s: $fails failed"; exit 1
