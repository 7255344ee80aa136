#!/usr/bin/python3
"""k8s_check.py: validate Kubernetes manifests offline, against the API's own types.

usage: k8s_check.py OPENAPI_YAML MANIFEST...

`kubectl create --dry-run=client` needs an API server (it asks it which resources exist and
for its OpenAPI schema), so this checks without one, using the typed models of Debian's
python3-kubernetes (the Kubernetes 1.22 API):
  * every key at every depth is a field of the model at that place (a misspelt or misplaced
    key fails: the API server would drop or refuse it), and every value has the model's type
    (object, list, string, integer, boolean; int-or-string fields take either);
  * the models' own required fields are present (containers, selector, ...);
  * references inside the set resolve: a workload's selector matches its pod labels; a
    Service selects a workload and its named target ports exist; probes name existing
    ports; volume mounts name declared volumes (or claim templates); secret volumes and
    secretKeyRefs name a Secret of the set and keys it has; a StatefulSet's serviceName is
    a headless Service of the set; resourceFieldRef names its own container;
  * an HTTP probe's path is a GET route of the coordinator's OpenAPI file that needs no
    token (security: []), since the kubelet sends none.
Prints one line per object, then errors (kind/name: where: what); exit 1 on any error.
"""
import re
import sys

import yaml
from kubernetes import client

KINDS = {("v1", "Namespace"): "V1Namespace", ("v1", "Secret"): "V1Secret",
         ("v1", "Service"): "V1Service", ("v1", "ConfigMap"): "V1ConfigMap",
         ("apps/v1", "StatefulSet"): "V1StatefulSet", ("apps/v1", "DaemonSet"): "V1DaemonSet",
         ("apps/v1", "Deployment"): "V1Deployment"}
PRIM = {"str": str, "int": int, "bool": bool, "float": (int, float)}
errors = []


def err(obj, where, what):
    errors.append("%s/%s: %s: %s" % (obj["kind"], obj["metadata"].get("name", "?"), where, what))


def walk(obj, value, typ, where):
    """Check @value against the model type name @typ."""
    if typ == "object":
        return
    m = re.fullmatch(r"list\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            return err(obj, where, "expected a list, got %r" % (value,))
        for i, v in enumerate(value):
            walk(obj, v, m.group(1), "%s[%d]" % (where, i))
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", typ)
    if m:
        if not isinstance(value, dict):
            return err(obj, where, "expected a map, got %r" % (value,))
        for k, v in value.items():
            walk(obj, v, m.group(1), "%s.%s" % (where, k))
        return
    if typ in PRIM:
        if not isinstance(value, PRIM[typ]) or (typ == "int" and isinstance(value, bool)):
            err(obj, where, "expected %s, got %r" % (typ, value))
        return
    if typ == "datetime":
        return
    model = getattr(client, typ)
    if not isinstance(value, dict):
        return err(obj, where, "expected a %s object, got %r" % (typ, value))
    by_json = {j: a for a, j in model.attribute_map.items()}
    for k, v in value.items():
        if k not in by_json:
            err(obj, "%s.%s" % (where, k), "unknown field of %s (known: %s)"
                % (typ, ", ".join(sorted(by_json))))
            continue
        walk(obj, v, model.openapi_types[by_json[k]], "%s.%s" % (where, k))


def pod_specs(o):
    spec = o.get("spec", {})
    if o["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
        return [spec.get("template", {}).get("spec", {})]
    return []


def containers(o):
    for ps in pod_specs(o):
        for c in ps.get("containers", []) + ps.get("initContainers", []):
            yield ps, c


def check_refs(objs, openapi):
    secrets = {o["metadata"]["name"]: set(o.get("data", {})) | set(o.get("stringData", {}))
               for o in objs if o["kind"] == "Secret"}
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    workloads = [o for o in objs if pod_specs(o)]
    for o in workloads:
        spec = o["spec"]
        sel = spec.get("selector", {}).get("matchLabels", {})
        labels = spec.get("template", {}).get("metadata", {}).get("labels", {})
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            err(o, "spec.selector", "matchLabels %r do not match the pod labels %r" % (sel, labels))
        if o["kind"] == "StatefulSet":
            svc = services.get(spec.get("serviceName"))
            if not svc or svc["spec"].get("clusterIP") != "None":
                err(o, "spec.serviceName", "%r is not a headless Service of this set"
                    % spec.get("serviceName"))
        claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
        for ps, c in containers(o):
            vols = {v["name"]: v for v in ps.get("volumes", [])}
            ports = {p.get("name") for p in c.get("ports", [])} | \
                    {p["containerPort"] for p in c.get("ports", [])}
            for vm in c.get("volumeMounts", []):
                if vm["name"] not in vols and vm["name"] not in claims:
                    err(o, "container %s volumeMount %s" % (c["name"], vm["name"]),
                        "no such volume or claim template")
            for name, v in vols.items():
                s = v.get("secret")
                if s:
                    keys = secrets.get(s.get("secretName"))
                    if keys is None:
                        err(o, "volume " + name, "Secret %r is not in this set" % s.get("secretName"))
                    else:
                        for it in s.get("items", []):
                            if it["key"] not in keys:
                                err(o, "volume " + name, "Secret %r has no key %r"
                                    % (s["secretName"], it["key"]))
            for e in c.get("env", []):
                vf = e.get("valueFrom", {})
                if "secretKeyRef" in vf:
                    r = vf["secretKeyRef"]
                    if r["key"] not in secrets.get(r["name"], ()):
                        err(o, "env " + e["name"], "no Secret %r with key %r" % (r["name"], r["key"]))
                if "resourceFieldRef" in vf and vf["resourceFieldRef"].get("containerName", c["name"]) != c["name"]:
                    err(o, "env " + e["name"], "resourceFieldRef names another container")
            for pk in ("readinessProbe", "livenessProbe", "startupProbe"):
                hg = c.get(pk, {}).get("httpGet")
                if not hg:
                    continue
                if hg["port"] not in ports:
                    err(o, "%s.%s" % (c["name"], pk), "port %r is not a container port" % hg["port"])
                route = openapi.get("paths", {}).get(hg["path"], {}).get("get")
                if route is None:
                    err(o, "%s.%s" % (c["name"], pk), "%s is no GET route of the API" % hg["path"])
                elif route.get("security") != []:
                    err(o, "%s.%s" % (c["name"], pk), "%s needs a token; probes send none" % hg["path"])
    for name, svc in services.items():
        sel = svc["spec"].get("selector", {})
        hits = [o for o in workloads
                if all(o["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                       for k, v in sel.items())]
        if not hits:
            err(svc, "spec.selector", "selects no workload of this set")
            continue
        names = {p.get("name") for o in hits for _, c in containers(o) for p in c.get("ports", [])}
        nums = {p["containerPort"] for o in hits for _, c in containers(o) for p in c.get("ports", [])}
        for p in svc["spec"].get("ports", []):
            t = p.get("targetPort", p["port"])
            if t not in names and t not in nums:
                err(svc, "port " + str(p.get("name")), "targetPort %r is no port of %s"
                    % (t, ", ".join(o["metadata"]["name"] for o in hits)))


def main():
    openapi = yaml.safe_load(open(sys.argv[1]))
    objs = []
    for path in sys.argv[2:]:
        for o in yaml.safe_load_all(open(path)):
            if o is None:
                continue
            if not isinstance(o, dict) or "kind" not in o or "metadata" not in o:
                errors.append("%s: a document without kind or metadata" % path)
                continue
            objs.append(o)
    api = client.ApiClient()
    for o in objs:
        model = KINDS.get((o.get("apiVersion"), o["kind"]))
        if not model:
            err(o, "apiVersion/kind", "%s %s is not checked here" % (o.get("apiVersion"), o["kind"]))
            continue
        n = len(errors)
        walk(o, o, model, o["kind"])
        try:  # the models raise ValueError for a missing required field
            api._ApiClient__deserialize(o, model)
        except (ValueError, TypeError) as e:
            err(o, "required fields", str(e))
        print("%s %s/%s: %s" % ("ok  " if len(errors) == n else "FAIL", o["kind"],
                                o["metadata"].get("name"), model))
    check_refs(objs, openapi)
    for e in errors:
        print("error: " + e)
    sys.exit(1 if errors else 0)


main()
