#!/usr/bin/env python3
"""Checks of deploy/ that need YAML (called by scripts/check-deploy, which
installs what this needs: PyYAML, jsonschema and kubernetes-validate in a
virtual environment).

  render OVERLAY            print the kustomization as one YAML stream
  kubernetes RENDERED.yaml  validate every manifest: built-in kinds with
                            kubernetes-validate --strict, custom resources
                            (KEDA, ServiceMonitor) against the vendored CRDs
                            in deploy/kubernetes/schemas/, strictly (an
                            unknown field is an error); then check that the
                            ScaledObjects and worker Deployments match the
                            fleets of the server config
  configmap-toml RENDERED.yaml OUT  write the server config of the ConfigMap
  nats-values VALUES CHART_VALUES   every key of VALUES exists in the chart
  same-objects A.yaml B.yaml        both streams hold the same objects
  build-context ROOT OUT CONTAINERFILE...  copy into OUT what ROOT/.dockerignore
                            admits into a build context, and check that every
                            file each Containerfile COPYs from the context is
                            there (check-deploy then loads the cargo
                            workspace from OUT)

The renderer understands the subset of Kustomize that deploy/kubernetes
uses (resources, namespace, labels without selectors, images) and refuses
any other key, so a new feature cannot be ignored silently.
"""

import copy
import os
import shutil
import re
import subprocess
import sys
import tomllib
import urllib.parse

import jsonschema
import yaml

SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "deploy", "kubernetes", "schemas")
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
KNOWN_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels", "images"}


def fail(message):
    print(f"check-deploy: {message}", file=sys.stderr)
    sys.exit(1)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def render(directory):
    with open(os.path.join(directory, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        fail(f"{directory}/kustomization.yaml: keys this renderer does not know: {sorted(unknown)}")
    objects = []
    for resource in k.get("resources", []):
        path = os.path.normpath(os.path.join(directory, resource))
        if os.path.isdir(path):
            objects += render(path)
        else:
            objects += load_all(path)
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            fail(f"{directory}: labels with selectors or templates are not supported here")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    if "namespace" in k:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for obj in objects:
            pod = obj.get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                name = re.split(r"[:@]", c["image"], maxsplit=1)[0]
                if name == image["name"]:
                    c["image"] = f'{image.get("newName", name)}:{image["newTag"]}'
    return objects


def key(obj):
    m = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], m.get("namespace", ""), m["name"])


def strict(schema):
    """The CRD schema with unknown fields refused: Kubernetes prunes them
    silently, which would hide a typo such as `valueLocaton`."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(api_version, kind):
    (crd,) = load_all(os.path.join(SCHEMAS, CRDS[(api_version, kind)]))
    version = api_version.split("/")[1]
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return strict(v["schema"]["openAPIV3Schema"])
    fail(f"{kind}: no version {version} in the vendored CRD")


def check_kubernetes(rendered):
    objects = load_all(rendered)
    builtin, custom = [], []
    for obj in objects:
        (custom if (obj["apiVersion"], obj["kind"]) in CRDS else builtin).append(obj)
    tmp = rendered + ".builtin.yaml"
    with open(tmp, "w") as f:
        yaml.safe_dump_all(builtin, f)
    for version in ("1.30.0", "1.37.0"):
        result = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "kubernetes-validate"), "--strict", "--quiet", "-k", version, tmp],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0 or result.stdout.strip() or result.stderr.strip():
            fail(f"kubernetes-validate (Kubernetes {version}):\n{result.stdout}{result.stderr}")
    for obj in custom:
        schema = crd_schema(obj["apiVersion"], obj["kind"])
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str)
        if errors:
            fail(f"{key(obj)}: " + "; ".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors))
    check_fleets(objects)
    print(f"check-deploy: {len(builtin)} built-in and {len(custom)} custom resources valid")


def server_config(objects):
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "cronoq.toml" in obj.get("data", {}):
            return obj["data"]["cronoq.toml"]
    fail("no ConfigMap with cronoq.toml")


def labels_text(labels):
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def check_fleets(objects):
    """Each ScaledObject asks /v1/autoscale about a declared fleet, with its
    bounds, for a worker Deployment whose labels and slots are the fleet's;
    every fleet has one."""
    config = tomllib.loads(server_config(objects))
    fleets = {}
    for pool in config.get("pools", []):
        for fleet in pool.get("fleets", []):
            fleets[(pool["name"], labels_text(fleet.get("labels", {})))] = fleet
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    auths = {o["metadata"]["name"] for o in objects if o["kind"] == "TriggerAuthentication"}
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    seen = set()
    for so in (o for o in objects if o["kind"] == "ScaledObject"):
        name = so["metadata"]["name"]
        spec = so["spec"]
        (trigger,) = spec["triggers"]
        meta = trigger["metadata"]
        expect = {"type": "metrics-api", "metricType": "AverageValue"}
        for k, v in expect.items():
            if trigger.get(k) != v:
                fail(f"ScaledObject {name}: {k} must be {v}")
        for k, v in {"valueLocation": "desired", "targetValue": "1", "format": "json", "authMode": "bearer"}.items():
            if meta.get(k) != v:
                fail(f"ScaledObject {name}: metadata.{k} must be {v!r}, is {meta.get(k)!r}")
        url = urllib.parse.urlsplit(meta["url"])
        if url.path != "/v1/autoscale":
            fail(f"ScaledObject {name}: url path {url.path}")
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True, strict_parsing=True))
        fleet_key = (query.get("pool", "default"), labels_text(dict(p.split("=", 1) for p in query.get("labels", "").split(",") if p)))
        fleet = fleets.get(fleet_key)
        if fleet is None:
            fail(f"ScaledObject {name}: asks about {fleet_key}, which the server config does not declare")
        seen.add(fleet_key)
        if (spec.get("minReplicaCount"), spec.get("maxReplicaCount")) != (fleet.get("min", 0), fleet["max"]):
            fail(f"ScaledObject {name}: min/maxReplicaCount must be the fleet's min/max {fleet.get('min', 0)}/{fleet['max']}")
        auth = trigger.get("authenticationRef", {}).get("name")
        if auth not in auths:
            fail(f"ScaledObject {name}: authenticationRef {auth!r} is not a TriggerAuthentication here")
        target = deployments.get(spec["scaleTargetRef"]["name"])
        if target is None:
            fail(f"ScaledObject {name}: no Deployment {spec['scaleTargetRef']['name']}")
        pod = target["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        args = container["args"]
        cut = args.index("--")
        flags = args[:cut]
        labels = {}
        for i, a in enumerate(flags):
            if a == "--label":
                k, v = flags[i + 1].split("=", 1)
                labels[k] = v
        pool = flags[flags.index("--pool") + 1] if "--pool" in flags else "default"
        slots = int(flags[flags.index("--slots") + 1]) if "--slots" in flags else 1
        if (pool, labels_text(labels)) != fleet_key:
            fail(f"Deployment {target['metadata']['name']}: workers of {(pool, labels_text(labels))}, but its ScaledObject scales {fleet_key}")
        if slots != fleet.get("slots_per_worker", 1):
            fail(f"Deployment {target['metadata']['name']}: --slots {slots}, but the fleet has slots_per_worker {fleet.get('slots_per_worker', 1)}")
        grace = next((e["value"] for e in container.get("env", []) if e["name"] == "CRONOQ_GRACE"), "30s")
        seconds = parse_seconds(grace)
        if pod.get("terminationGracePeriodSeconds", 30) <= seconds:
            fail(f"Deployment {target['metadata']['name']}: terminationGracePeriodSeconds must exceed CRONOQ_GRACE ({grace}) or a scale-in kills attempts")
    for ta in (o for o in objects if o["kind"] == "TriggerAuthentication"):
        for ref in ta["spec"].get("secretTargetRef", []):
            if ref["name"] not in secrets:
                print(f"check-deploy: note: Secret {ref['name']} is not in this overlay (create it in the cluster)")
    missing = set(fleets) - seen
    if missing:
        fail(f"fleets without a ScaledObject: {sorted(missing)}")


def parse_seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        fail(f"cannot read the duration {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def check_nats_values(values_path, chart_values_path):
    with open(values_path) as f:
        values = yaml.safe_load(f)
    with open(chart_values_path) as f:
        chart = yaml.safe_load(f)

    def walk(ours, theirs, path):
        for k, v in ours.items():
            here = f"{path}.{k}" if path else k
            if not isinstance(theirs, dict) or k not in theirs:
                fail(f"{values_path}: {here} is not a value of the NATS chart")
            default = theirs[k]
            # An empty map in the chart's values is free-form (env, resources, ...).
            if isinstance(v, dict) and isinstance(default, dict) and default:
                walk(v, default, here)
            elif isinstance(v, dict) and default not in ({}, None):
                fail(f"{values_path}: {here} is a map, the chart has {default!r}")

    walk(values, chart, "")
    print(f"check-deploy: {values_path}: every key is a value of the chart")


def same_objects(a, b):
    left = {key(o): o for o in load_all(a)}
    right = {key(o): o for o in load_all(b)}
    if left != right:
        diff = set(left) ^ set(right) or {k for k in left if left[k] != right[k]}
        fail(f"the Python rendering and kubectl kustomize differ on {sorted(diff)}")
    print(f"check-deploy: the Python rendering equals kubectl kustomize ({len(left)} objects)")


def ignore_patterns(path):
    """The patterns of a .dockerignore as (regex, negated), in order."""
    patterns = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            text = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
            if re.search(r"[\[\]\\{}]", text):
                fail(f"{path}: {line!r}: this checker reads only *, ** and ? patterns")
            rx = ""
            i = 0
            while i < len(text):
                if text.startswith("**/", i):
                    rx, i = rx + "(?:.*/)?", i + 3
                elif text.startswith("**", i):
                    rx, i = rx + ".*", i + 2
                elif text[i] == "*":
                    rx, i = rx + "[^/]*", i + 1
                elif text[i] == "?":
                    rx, i = rx + "[^/]", i + 1
                else:
                    rx, i = rx + re.escape(text[i]), i + 1
            patterns.append((re.compile(rx), negated))
    return patterns


def admitted(patterns, rel):
    """As Docker decides: the last pattern that matches the path or one
    of its parent directories wins; a path no pattern matches is sent."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    keep = True
    for rx, negated in patterns:
        if any(rx.fullmatch(p) for p in prefixes):
            keep = negated
    return keep


def build_context(root, out, containerfiles):
    patterns = ignore_patterns(os.path.join(root, ".dockerignore"))
    # A directory no pattern re-admits below it is not walked (target/).
    negations = [rx.pattern for rx, negated in patterns if negated]
    count = 0
    for here, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(here, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = [
            d
            for d in dirs
            if admitted(patterns, rel_dir + d)
            or any(n.startswith(re.escape(rel_dir + d + "/")) or n.startswith("(?:.*/)?") for n in negations)
        ]
        for name in files:
            rel = rel_dir + name
            if admitted(patterns, rel):
                os.makedirs(os.path.join(out, rel_dir), exist_ok=True)
                shutil.copy2(os.path.join(root, rel), os.path.join(out, rel))
                count += 1
    if count == 0:
        fail(f"{root}/.dockerignore admits nothing")
    for containerfile in containerfiles:
        with open(containerfile) as f:
            text = re.sub(r"\\\n", " ", f.read())
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].upper() not in ("COPY", "ADD"):
                continue
            flags = [w for w in words[1:] if w.startswith("--")]
            if any(w.startswith("--from=") for w in flags):
                continue
            sources = [w for w in words[1:] if not w.startswith("--")][:-1]
            for source in sources:
                if not os.path.exists(os.path.join(out, source)):
                    fail(f"{containerfile}: COPY {source}: not in the build context (.dockerignore)")
    print(f"check-deploy: the build context holds {count} files; every COPY source of {', '.join(containerfiles)} is in it")


def main():
    command, *args = sys.argv[1:]
    if command == "render":
        yaml.safe_dump_all(render(args[0]), sys.stdout, sort_keys=True)
    elif command == "kubernetes":
        check_kubernetes(args[0])
    elif command == "configmap-toml":
        with open(args[1], "w") as f:
            f.write(server_config(load_all(args[0])))
    elif command == "nats-values":
        check_nats_values(*args)
    elif command == "same-objects":
        same_objects(*args)
    elif command == "build-context":
        build_context(args[0], args[1], args[2:])
    else:
        fail(f"unknown command {command}")


if __name__ == "__main__":
    main()
