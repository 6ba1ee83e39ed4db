#!/usr/bin/env bash
# Checks the deployment files the way a cluster and a Prometheus would read them:
#   - every Kustomize overlay in deploy/kustomize/overlays/ renders (kubectl kustomize) and
#     validates against the Kubernetes schemas of the oldest and newest versions we support
#     (kubernetes-validate --strict: unknown fields fail); the PrometheusRule's rules pass
#     `promtool check rules` and the unit tests in deploy/prometheus/rules-test.yaml; the
#     ServiceMonitor selects the server's Service and names a port it has; the properties
#     the agent and server rely on (host network, /dev/shm, probes, ...) are there;
#   - every query of the Grafana dashboard parses (promtool, as recording rules);
#   - docker/compose.yaml validates against the Compose specification's schema.
# That the rules and panels name metrics /metrics really exports is checked by
# server/tests/metrics.rs. Tools: scripts/setup.sh --test installs them.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
tools=${HEDDLE_TOOLS_DIR:-$HOME/.cache/heddle-tools}
venv=${HEDDLE_DEPLOY_VENV:-$tools/venv}
k8s_versions=(1.29.0 1.33.0)
fail() { printf 'check-deploy: %s\n' "$*" >&2; exit 1; }
t0=$(date +%s)

kubectl=kubectl
command -v kubectl >/dev/null && kubectl kustomize deploy/kustomize/base >/dev/null 2>&1 || kubectl=$tools/bin/kubectl
for tool in "$kubectl" promtool "$venv/bin/kubernetes-validate" "$venv/bin/check-jsonschema"; do
    command -v "$tool" >/dev/null || fail "$tool is missing; run: scripts/setup.sh --test"
done
py=$venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

overlays=(deploy/kustomize/overlays/*/)
((${#overlays[@]})) || fail "no overlay under deploy/kustomize/overlays"
# Components no overlay includes are rendered on top of production, as an admin adds them.
for comp in job-env; do
    combo=$tmp/overlays/production+$comp
    mkdir -p "$combo"
    rel=$(realpath --relative-to="$combo" "$repo/deploy/kustomize")
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: heddle\nresources: [%s]\ncomponents: [%s]\n' \
        "$rel/overlays/production" "$rel/components/$comp" >"$combo/kustomization.yaml"
    overlays+=("$combo/")
done
for dir in "${overlays[@]}"; do
    name=$(basename "$dir")
    out=$tmp/$name.yaml
    "$kubectl" kustomize "$dir" >"$out" || fail "kubectl kustomize $dir failed"
    for v in "${k8s_versions[@]}"; do
        "$venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$out" >"$tmp/validate.log" 2>&1 \
            || { cat "$tmp/validate.log" >&2; fail "$name does not validate against Kubernetes $v"; }
        # Only the Prometheus Operator's and cert-manager's kinds may lack a schema; they
        # are checked below.
        if grep "Couldn't find schema" "$tmp/validate.log" \
            | grep -v -e "api version monitoring.coreos.com/v1 " -e "api version cert-manager.io/v1 " >&2; then
            fail "$name has a kind without a Kubernetes schema"
        fi
    done
    "$py" - "$out" "$tmp/$name" <<'PY' || fail "$name: see above"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
problems = []
def need(cond, what):
    if not cond:
        problems.append(what)

ds = by_kind["DaemonSet"][0]["spec"]["template"]["spec"]
agent = ds["containers"][0]
need(ds.get("hostNetwork") is True, "agent: hostNetwork: true (facts and tests use the node's interfaces)")
need(ds.get("dnsPolicy") == "ClusterFirstWithHostNet", "agent: dnsPolicy ClusterFirstWithHostNet")
need(ds.get("priorityClassName") == "system-node-critical", "agent: priority system-node-critical")
need(any(m["mountPath"] == "/dev/shm" for m in agent["volumeMounts"]), "agent: a /dev/shm volume for NCCL")
need(any(m["mountPath"] == "/sys" and m.get("readOnly") for m in agent["volumeMounts"]), "agent: /sys read-only")
need("IPC_LOCK" in agent["securityContext"]["capabilities"].get("add", []), "agent: IPC_LOCK")
need(all(p in agent for p in ("startupProbe", "readinessProbe", "livenessProbe")), "agent: probes")
need(ds.get("nodeSelector") and ds.get("tolerations"), "agent: nodeSelector and tolerations for GPU nodes")

dep = by_kind["Deployment"][0]["spec"]["template"]["spec"]
srv = dep["containers"][0]
sc = srv["securityContext"]
need(dep["securityContext"].get("runAsNonRoot") is True, "server: runAsNonRoot")
need(dep["securityContext"].get("seccompProfile", {}).get("type") == "RuntimeDefault", "server: seccomp RuntimeDefault")
need(sc.get("readOnlyRootFilesystem") is True, "server: read-only root filesystem")
need(sc.get("capabilities", {}).get("drop") == ["ALL"], "server: all capabilities dropped")
need(srv["readinessProbe"]["httpGet"]["path"] == "/readyz", "server: readiness on /readyz")
need(srv["livenessProbe"]["httpGet"]["path"] == "/healthz", "server: liveness on /healthz")
need("PodDisruptionBudget" in by_kind, "server: a PodDisruptionBudget")
env = {e["name"]: e for e in srv["env"]}
need("secretKeyRef" in env["HEDDLE_DATABASE_URL"]["valueFrom"], "server: database URL from a Secret")

svc = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "heddle-server")
for sm in by_kind.get("ServiceMonitor", []):
    sel = sm["spec"]["selector"]["matchLabels"]
    labels = svc["metadata"].get("labels", {})
    need(all(labels.get(k) == v for k, v in sel.items()), f"ServiceMonitor selects {sel}, the Service has {labels}")
    ports = {p["name"] for p in svc["spec"]["ports"]}
    for ep in sm["spec"]["endpoints"]:
        need(ep["port"] in ports, f"ServiceMonitor port {ep['port']} is not a Service port {ports}")
        need(ep.get("path") == "/metrics", "ServiceMonitor path /metrics")
# The job-env component: a webhook that never blocks pods, on a server that serves it
# over TLS with the certificate its CA annotation names, and agents that fill the directory
# it mounts.
for wh in by_kind.get("MutatingWebhookConfiguration", []):
    certs = {f"{c['metadata'].get('namespace')}/{c['metadata']['name']}": c for c in by_kind.get("Certificate", [])}
    ca_from = wh["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
    need(ca_from in certs, f"webhook: cert-manager.io/inject-ca-from {ca_from} names no Certificate")
    for w in wh["webhooks"]:
        need(w.get("failurePolicy") == "Ignore", "webhook: failurePolicy Ignore (never block pods)")
        need(w.get("sideEffects") == "None", "webhook: sideEffects None")
        need(w["namespaceSelector"]["matchLabels"] == {"heddle.io/inject": "enabled"}, "webhook: namespaceSelector heddle.io/inject=enabled")
        s = w["clientConfig"]["service"]
        need(s["name"] == svc["metadata"]["name"] and s["namespace"] == svc["metadata"]["namespace"], "webhook: calls the heddle-server Service")
        need(s["port"] in [p["port"] for p in svc["spec"]["ports"]], "webhook: a port of the Service")
        need(s["path"] == "/k8s/admission/v1/mutate", "webhook: path /k8s/admission/v1/mutate")
        if ca_from in certs:
            dns = certs[ca_from]["spec"]["dnsNames"]
            need(f"{s['name']}.{s['namespace']}.svc" in dns, f"webhook: the certificate covers {s['name']}.{s['namespace']}.svc")
            secret = certs[ca_from]["spec"]["secretName"]
            vols = {v["name"]: v for v in dep.get("volumes", [])}
            need(any(v.get("secret", {}).get("secretName") == secret for v in vols.values()), "server: mounts the webhook's certificate")
    need(env.get("HEDDLE_K8S_ADMISSION", {}).get("value") == "true", "server: HEDDLE_K8S_ADMISSION=true")
    need("HEDDLE_TLS_CERT" in env and "HEDDLE_TLS_KEY" in env, "server: serves HTTPS (HEDDLE_TLS_CERT, HEDDLE_TLS_KEY)")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        need(srv[probe]["httpGet"].get("scheme") == "HTTPS", f"server: {probe} over HTTPS")
    agent_env = {e["name"]: e.get("value") for e in agent.get("env", [])}
    need(agent_env.get("HEDDLE_NCCL_ENV_FILE", "").startswith("/var/lib/heddle-agent/job/"), "agent: the env file in the job directory")
    need(any(c["name"] == "install-nccl-env-plugin" for c in ds.get("initContainers", [])), "agent: installs the NCCL env plugin")
    for v in ds["volumes"]:
        items = v.get("secret", {}).get("items")
        if v.get("secret"):
            need(items == [{"key": "ca.crt", "path": "ca.crt"}], "agent: only ca.crt of the server's Secret")
for i, pr in enumerate(by_kind.get("PrometheusRule", [])):
    yaml.safe_dump(pr["spec"], open(f"{sys.argv[2]}.rules-{i}.yaml", "w"), sort_keys=False)
for p in problems:
    print("check-deploy:", sys.argv[1].rsplit("/", 1)[-1], "-", p, file=sys.stderr)
sys.exit(1 if problems else 0)
PY
    for rules in "$tmp/$name".rules-*.yaml; do
        [[ -e "$rules" ]] || continue
        promtool check rules "$rules" >&2 || fail "$name: promtool rejects the PrometheusRule"
        cp "$rules" "$tmp/heddle.rules.yaml"
        cp deploy/prometheus/rules-test.yaml "$tmp/"
        promtool test rules "$tmp/rules-test.yaml" >&2 || fail "$name: the alert rules fail deploy/prometheus/rules-test.yaml"
    done
    echo "check-deploy: $name renders and validates ($(grep -c '^kind:' "$out") objects)" >&2
done

# The dashboard's queries, with Grafana's variables filled in, as recording rules.
dashboard=deploy/kustomize/components/monitoring/grafana-dashboard.json
"$py" - "$dashboard" "$tmp/dashboard.rules.yaml" <<'PY' || fail "$dashboard: see above"
import json, sys, yaml
d = json.load(open(sys.argv[1]))
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
rules = []
for p in d["panels"]:
    assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
    assert p["targets"], f"panel {p['title']!r} has no query"
    for t in p["targets"]:
        expr = (t["expr"].replace("$__rate_interval", "5m").replace("$Hostname", ".*")
                .replace("$test", ".*"))
        assert "$" not in expr, f"{p['title']}: unknown variable in {t['expr']}"
        rules.append({"record": f"dashboard:panel_{p['id']}:{t['refId']}", "expr": expr})
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
print(f"check-deploy: dashboard {d['title']!r}: {len(d['panels'])} panels, {len(rules)} queries", file=sys.stderr)
PY
promtool check rules "$tmp/dashboard.rules.yaml" >&2 || fail "a query of $dashboard does not parse"

"$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker/compose.yaml >&2 \
    || fail "docker/compose.yaml does not follow the Compose specification"
# And as the installed Compose reads it (interpolation, profiles), where there is one.
if docker compose version >/dev/null 2>&1; then
    docker compose -f docker/compose.yaml --profile gpu-node config -q || fail "docker compose rejects docker/compose.yaml"
elif command -v docker-compose >/dev/null; then
    docker-compose -f docker/compose.yaml --profile gpu-node config -q || fail "docker-compose rejects docker/compose.yaml"
fi
echo "check-deploy: all deployment files check out in $(( $(date +%s) - t0 )) s" >&2
