#!/usr/bin/env python3
"""openapi_check.py: check recorded responses of the running coordinator against
docs/api/openapi.yaml: each (method, route template) is documented, the status is one the
operation documents, the content type matches, the JSON body fits the documented schema,
and every documented operation was exercised.

usage: openapi_check.py OPENAPI.yaml RECORDS.tsv
RECORDS.tsv lines: METHOD<TAB>TEMPLATE<TAB>STATUS<TAB>CONTENT-TYPE<TAB>BODY-FILE
"""
import json
import sys

import yaml


def resolve(spec, node):
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = spec
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def validate(spec, schema, value, path="$"):
    """Return a list of problems of @value against @schema (the subset of JSON Schema the
    OpenAPI file uses: type, nullable, enum, required, properties, items, allOf,
    additionalProperties)."""
    schema = resolve(spec, schema)
    errs = []
    if value is None:
        if schema.get("nullable"):
            return []
        if "allOf" not in schema and "type" in schema:
            return [f"{path}: null but not nullable"]
    for sub in schema.get("allOf", []):
        errs += validate(spec, sub, value, path)
    t = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if t and not checks[t](value):
        return errs + [f"{path}: expected {t}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: {value!r} not in {schema['enum']}")
    if t == "object" or (isinstance(value, dict) and "properties" in schema):
        for k in schema.get("required", []):
            if k not in value:
                errs.append(f"{path}: missing required key '{k}'")
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                errs += validate(spec, sub, value[k], f"{path}.{k}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k, v in value.items():
                if k not in schema.get("properties", {}):
                    errs += validate(spec, extra, v, f"{path}.{k}")
    if t == "array":
        for i, v in enumerate(value):
            errs += validate(spec, schema.get("items", {}), v, f"{path}[{i}]")
    return errs


def main():
    spec = yaml.safe_load(open(sys.argv[1]))
    ops = {(m.upper(), p) for p, item in spec["paths"].items() for m in item
           if m in ("get", "post", "put", "delete", "patch")}
    seen = set()
    problems = 0
    for line in open(sys.argv[2]):
        method, template, status, ctype, body_file = line.rstrip("\n").split("\t")
        where = f"{method} {template} -> {status}"
        item = spec["paths"].get(template)
        if not item or method.lower() not in item:
            print(f"FAIL {where}: route not documented")
            problems += 1
            continue
        seen.add((method, template))
        op = item[method.lower()]
        resp = op["responses"].get(status)
        if resp is None:
            print(f"FAIL {where}: status not documented (has {sorted(op['responses'])})")
            problems += 1
            continue
        resp = resolve(spec, resp)
        content = resp.get("content", {})
        base = ctype.split(";")[0].strip()
        if content and base not in content:
            print(f"FAIL {where}: content type {base!r} not documented ({sorted(content)})")
            problems += 1
            continue
        schema = content.get(base, {}).get("schema")
        if schema is not None and "json" in base:
            try:
                value = json.load(open(body_file))
            except ValueError as e:
                print(f"FAIL {where}: body is not JSON: {e}")
                problems += 1
                continue
            errs = validate(spec, schema, value)
            if errs:
                print(f"FAIL {where}: " + "; ".join(errs[:5]))
                problems += 1
                continue
        print(f"ok   {where}")
    for method, template in sorted(ops - seen):
        print(f"FAIL {method} {template}: documented but not exercised")
        problems += 1
    print(f"{len(seen)}/{len(ops)} documented operations exercised, {problems} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
