#!/usr/bin/env python3
"""The boundary replayed against a running server (docs/security.md): every attack an
operator token, an enrollment token or a hostile agent can try at the API, each with the
answer the policy gives, plus controls that must be accepted (so a refusal is the policy's,
not a broken request). Run by `scripts/device-e2e.sh --boundary` against the release build;
stdlib only.

    boundary.py URL ADMIN_TOKEN NODE HEDDLE_CLI WORKDIR

Prints one line per attack and a last line `boundary: N attacks, M breaches`; exits 1 on a
breach (an attack accepted, a 5xx, the server not answering afterwards).
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

URL, TOKEN, NODE, CLI, WORK = sys.argv[1:6]
lines, breaches = [], []


def call(method, path, body=None, token=TOKEN, raw=None, ctype="application/json"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(URL + path, method=method, data=data)
    if token:
        req.add_header("authorization", "Bearer " + token)
    if data is not None:
        req.add_header("content-type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, text = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read()
    except Exception as e:  # refused connection, reset, timeout
        status, text = 0, str(e).encode()
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        doc = text.decode(errors="replace")
    return status, doc


def message(doc):
    return doc.get("message", "") if isinstance(doc, dict) else str(doc)


def record(what, status, doc, ok, want):
    line = f"{'ok    ' if ok else 'BREACH'} {status:3d} {what}: {message(doc)[:150]!r}"
    lines.append(line)
    print(line, flush=True)
    if not ok:
        breaches.append(f"{what}: got {status}, wanted {want}")


def refused(what, method, path, body=None, needle="", statuses=(422,), **kw):
    status, doc = call(method, path, body, **kw)
    ok = status in statuses and needle.lower() in message(doc).lower()
    record(what, status, doc, ok, f"{statuses} naming {needle!r}")
    return status


def accepted(what, method, path, body=None):
    status, doc = call(method, path, body)
    record(what, status, doc, 200 <= status < 300, "2xx (a control)")
    return doc


def runs_count():
    status, doc = call("GET", "/api/v1/runs?limit=1000")
    return len(doc) if status == 200 and isinstance(doc, list) else -1


profiles = "/api/v1/tuning-profiles"
recs = f"/api/v1/nodes/{NODE}/recommendations"
runs_before = runs_count()

# Controls: the same shapes with harmless content are accepted.
p = accepted("control: a node profile NCCL_IB_HCA=mlx5_0", "POST", profiles,
             {"name": "bnd-control", "node": NODE, "env": {"NCCL_IB_HCA": "mlx5_0"}})
if isinstance(p, dict) and p.get("id"):
    call("DELETE", f"{profiles}/{p['id']}")
accepted("control: manual recommendations with a trait", "PUT", recs,
         {"source": "bnd-control", "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": "GPU↔NIC, naïve"}],
          "traits": {"rack": "夜間-3"}})
accepted("control: clearing them", "PUT", recs, {"source": "bnd-control", "items": []})

# Names that hand a root process to whoever chose the value, at all three doors.
denied = {
    "NCCL_COMM_ID": "203.0.113.7:5000",  # a fixed bootstrap address anyone can join
    "NCCL_RAS_ADDR": "0.0.0.0:28028",  # NCCL's unauthenticated RAS listener on every interface
    "UCX_PROFILE_MODE": "log,accum",  # root writes ucx_<host>_<pid>.prof, following links
    "NCCL_PROXY_PROFILE": "/tmp/x",  # writes a file where it is told
    "LD_PRELOAD": "/tmp/x.so",
    "PATH": "/tmp:/usr/bin",
    "NCCL_NET_PLUGIN": "/tmp/evil.so",
    "NCCL_DEBUG_FILE": "/etc/cron.d/x",
    "UCX_GDB_COMMAND": "/tmp/x",
    "UCX_MODULE_DIR": "/tmp",
    "HEDDLE_URL": "http://203.0.113.7",
}
for name, value in denied.items():
    refused(f"run env {name}", "POST", "/api/v1/runs",
            {"kind": "nccl", "nodes": [NODE], "env": {name: value}}, name)
    refused(f"node profile {name}", "POST", profiles,
            {"name": "bnd-denied", "node": NODE, "env": {name: value}}, name)
    refused(f"recommendation {name}", "PUT", recs,
            {"source": "bnd", "items": [{"name": name, "value": value}]}, name)

# Text that reads differently from what it does, in every field people read.
for label, hidden in [("U+202E", "mlx5_0\u202e1_5xlm"), ("U+2028", "a\u2028b"), ("U+200B", "mlx5\u200b_0"),
                      ("newline", "a\nexport X=1"), ("NUL", "a\u0000b")]:
    refused(f"run env value with {label}", "POST", "/api/v1/runs",
            {"kind": "nccl", "nodes": [NODE], "env": {"NCCL_IB_HCA": hidden}}, "NCCL_IB_HCA")
    refused(f"recommendation value with {label}", "PUT", recs,
            {"source": "bnd", "items": [{"name": "NCCL_IB_HCA", "value": hidden}]})
    refused(f"recommendation reason with {label}", "PUT", recs,
            {"source": "bnd", "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0", "reason": hidden}]})
    refused(f"recommendation source with {label}", "PUT", recs,
            {"source": hidden, "items": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}]})
    refused(f"trait with {label}", "PUT", recs,
            {"source": "bnd", "items": [], "traits": {"rack": hidden}}, "trait")
    refused(f"run label with {label}", "POST", "/api/v1/runs",
            {"kind": "sleep", "params": {"seconds": 0.1}, "nodes": [NODE], "label": hidden}, "label")
    refused(f"investigation label with {label}", "POST", "/api/v1/investigations",
            {"kind": "nccl", "nodes": [NODE, NODE + "-x"], "label": hidden}, "label")

# An environment big enough to make every test on the node fail to start (E2BIG).
many = {f"NCCL_X{i}": "1" for i in range(300)}
refused("run env of 300 variables", "POST", "/api/v1/runs", {"kind": "nccl", "nodes": [NODE], "env": many},
        "the run's env: 300")
refused("node profile of 300 variables", "POST", profiles, {"name": "bnd-huge", "node": NODE, "env": many}, "300")
big = accepted("control: a node profile of 200 variables", "POST", profiles,
               {"name": "bnd-big", "node": NODE, "env": {f"NCCL_P{i}": "1" for i in range(200)}})
refused("run env of 100 on top of it", "POST", "/api/v1/runs",
        {"kind": "nccl", "nodes": [NODE], "env": {f"NCCL_R{i}": "1" for i in range(100)}}, "run: 100")
if isinstance(big, dict) and big.get("id"):
    call("DELETE", f"{profiles}/{big['id']}")
refused("value of 5000 bytes", "POST", "/api/v1/runs",
        {"kind": "nccl", "nodes": [NODE], "env": {"NCCL_IB_HCA": "m" * 5000}}, "NCCL_IB_HCA")

# Bodies built to hurt the parser: never a 5xx.
for what, raw in [("a body of 3 MiB", b'{"kind":"nccl","nodes":["' + b"a" * (3 << 20) + b'"]}'),
                  ("nesting 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
                  ("bytes that are not UTF-8", b'{"kind":"nccl\xff\xfe","nodes":["x"]}'),
                  ("a lone surrogate", b'{"kind":"nccl","nodes":["\\ud800"]}'),
                  ("a number past f64", b'{"kind":"nccl","nodes":["x"],"timeout_s":1e400}')]:
    status, doc = call("POST", "/api/v1/runs", raw=raw)
    record(what, status, doc, 400 <= status < 500, "4xx")

# Identity: no token, a forged one, an agent's hostname and version.
refused("POST /runs without a token", "POST", "/api/v1/runs", {"kind": "sleep", "nodes": [NODE]},
        statuses=(401,), token=None)
refused("POST /runs with a forged token", "POST", "/api/v1/runs", {"kind": "sleep", "nodes": [NODE]},
        statuses=(401,), token="hdl_" + "A" * 43)
refused("enrollment token name with U+202E", "POST", "/api/v1/enrollment-tokens",
        {"name": "rack\u202e3", "max_uses": 1}, "name")
status, tok = call("POST", "/api/v1/enrollment-tokens", {"name": "boundary", "max_uses": 3})
secret = tok.get("token") if isinstance(tok, dict) else None
if not secret:
    record("enrollment token for the identity attacks", status, tok, False, "201 with a token")
else:
    for what, host, version in [("hostname with U+202E", "gpu\u202e1", "1"),
                                ("hostname ../etc", "../etc", "1"),
                                ("hostname with a space", "gpu 1; rm -rf /", "1"),
                                ("agent_version with U+202E", "bnd-agent", "1.0\u202e9.0"),
                                ("agent_version of 5000 bytes", "bnd-agent", "v" * 5000)]:
        needle = "agent_version" if "agent_version" in what else "host name"
        refused(f"enrollment {what}", "POST", "/api/v1/agent/enroll",
                {"enroll_token": secret, "hostname": host, "agent_version": version}, needle, token=None)
    s, _ = call("GET", "/api/v1/nodes/bnd-agent")
    record("no node made by the refused enrollments", s, {"message": ""}, s == 404, "404")

# The env export: a value can only ever be a value once sourced by a shell.
marker = os.path.join(WORK, "boundary-pwned")
inject = f"mlx5_0'; touch {marker}; echo '"
status, doc = call("PUT", recs, {"source": "bnd-quote", "items": [{"name": "NCCL_IB_HCA", "value": inject}]})
if 200 <= status < 300:
    script = subprocess.run([CLI, "env", NODE], capture_output=True, text=True, timeout=30)
    shell = subprocess.run(["bash", "-c", 'eval "$1"; printf %s "$NCCL_IB_HCA"', "_", script.stdout],
                           capture_output=True, text=True, timeout=30)
    ok = not os.path.exists(marker) and shell.stdout == inject
    record("a quote in a value, sourced from `heddle env`", status,
           {"message": f"sourced value {'is the literal' if shell.stdout == inject else repr(shell.stdout)}"},
           ok, "nothing run, the value as given")
    call("PUT", recs, {"source": "bnd-quote", "items": []})
else:
    record("a quote in a value refused", status, doc, status == 422, "422 or quoted")

# Nothing refused became a run, nothing denied reached the node's job environment, and the
# server still answers.
after = runs_count()
record("runs created by refused requests", 200, {"message": f"{runs_before} before, {after} after"},
       after == runs_before, "no new run")
status, env = call("GET", f"/api/v1/nodes/{NODE}/job-env")
names = [e.get("name") for e in (env.get("entries", []) if isinstance(env, dict) else [])]
leaked = sorted(set(names) & (set(denied) | set(many)))
record("denied names in the node's job environment", status, {"message": f"entries {names}"},
       status == 200 and not leaked, "none")
time.sleep(0.2)
status, doc = call("GET", "/readyz", token=None)
record("the server answers afterwards", status, doc or {"message": ""}, status == 200, "200")

print(f"boundary: {len(lines)} attacks and controls, {len(breaches)} breaches")
for b in breaches:
    print(f"BREACH {b}")
sys.exit(1 if breaches else 0)
