#!/usr/bin/env python3
"""Questions scripts/device-e2e.sh asks of the CLI's JSON (`heddle --json runs watch`:
{run, results}; `investigate ls/show`). Prints the answer; exit 0 yes, 1 no (the answer says
why), 2 "not yet" (a feature the server does not have yet; the caller notes it)."""

import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def verdicts(doc):
    return [(r["hostname"], r.get("verdict") or {}) for r in doc.get("results", [])]


def largest_busbw(result):
    """Mean busbw of the rows at the largest size, as the server's headline."""
    rows = [r for r in result.get("rows", []) if r.get("busbw_gbs") is not None]
    if not rows:
        return None
    top = max(r["size_bytes"] for r in rows)
    vals = [r["busbw_gbs"] for r in rows if r["size_bytes"] == top]
    return sum(vals) / len(vals)


def headline(result):
    v = result.get("verdict") or {}
    if v.get("value") is not None:
        return v.get("metric") or "", v["value"]
    b = largest_busbw(result)
    return ("busbw_gbs", b) if b is not None else ("", None)


def env_of(doc):
    """{hostname: {name: (value, source)}} of the run's jobs."""
    return {
        j["hostname"]: {e["name"]: (e["value"], e["source"]) for e in j.get("applied_env", [])}
        for j in doc["run"]["jobs"]
    }


def main():
    what, path, *args = sys.argv[1:]
    doc = load(path)
    if what == "succeeded":
        run = doc["run"]
        bad = [
            f"{r['hostname']} {r['outcome']}: {(r.get('reason') or '')[:200]}"
            for r in doc.get("results", [])
            if r["outcome"] != "succeeded"
        ]
        errs = [f"{j['hostname']} {j['state']}: {(j.get('error') or '')[:200]}" for j in run["jobs"] if j["state"] != "succeeded"]
        if run["state"] != "succeeded" or bad or not doc.get("results"):
            print(f"run {run['state']}; " + "; ".join(bad or errs or ["no results"]))
            return 1
        print("succeeded")
        return 0
    if what == "not-fail":
        fails = [f"{h}: {[x['message'] for x in v.get('reasons', [])][:3]}" for h, v in verdicts(doc) if v.get("verdict") == "fail"]
        print("judged FAIL: " + "; ".join(fails) if fails else "no FAIL")
        return 1 if fails else 0
    if what == "reason-code":
        code = args[0]
        seen = [(h, v.get("verdict"), [x.get("code") for x in v.get("reasons", [])]) for h, v in verdicts(doc)]
        ok = any(code in codes for _, _, codes in seen)
        print(f"{code} {'found' if ok else 'missing'}: {seen}")
        return 0 if ok else 1
    if what == "worse":
        vs = verdicts(doc)
        lines = []
        worse = bool(vs)
        for h, v in vs:
            basis = [x["basis"] for x in v.get("reasons", []) if x.get("severity") in ("warn", "fail")]
            lines.append(f"{h} {v.get('verdict')} ({', '.join(basis) or 'no reason'})")
            if v.get("verdict") not in ("warn", "fail") or "node-baseline" not in basis:
                worse = False
        print(("judged worse than the pair's own figures: " if worse else "not judged worse against the node baseline: ") + "; ".join(lines))
        return 0 if worse else 1
    if what == "env-in-reasons":
        name = args[0]
        texts = [json.dumps(v.get("reasons", [])) for _, v in verdicts(doc)]
        if texts and all(name in t for t in texts):
            print(f"every verdict's reasons name {name}")
            return 0
        applied = {h: e.get(name) for h, e in env_of(doc).items()}
        if all(applied.values()):
            print(f"the verdict's reasons do not quote the environment yet; the jobs' applied_env has {name}: {applied}")
            return 2
        print(f"neither the verdict's reasons nor the jobs' applied_env show {name}: {applied}")
        return 1
    if what == "figure":
        print(", ".join(f"{r['hostname']} {headline(r)[1]:.1f}" if headline(r)[1] is not None else f"{r['hostname']} -" for r in doc.get("results", [])))
        return 0
    if what == "mean":
        vals = [headline(r)[1] for r in doc.get("results", []) if headline(r)[1] is not None]
        print(f"{sum(vals) / len(vals):.1f}" if vals else "-")
        return 0
    if what == "verdicts":
        print(", ".join(f"{h} {v.get('verdict', 'none')}" for h, v in verdicts(doc)) or "none")
        return 0
    if what == "applied-env":
        envs = env_of(doc)
        print("; ".join(f"{h}: " + (" ".join(f"{k}={v}({s})" for k, (v, s) in sorted(e.items())) or "(empty)") for h, e in envs.items()))
        return 0
    if what == "mixed":
        run = doc["run"]
        values = {h: e.get("NCCL_MAX_NCHANNELS", ("unset", ""))[0] for h, e in env_of(doc).items()}
        errors = " ".join((j.get("error") or "") for j in run["jobs"]) + " ".join((r.get("reason") or "") for r in doc.get("results", []))
        if run["state"] == "skipped":
            reasons = sorted({(r.get("reason") or "")[:120] for r in doc.get("results", [])})
            print(f"skipped ({'; '.join(reasons)}); the ranks would have run with NCCL_MAX_NCHANNELS {values}")
            return 2
        if run["state"] == "succeeded" and len(set(values.values())) == 1:
            print(f"resolved: both ranks ran with NCCL_MAX_NCHANNELS={values.popitem()[1]}")
            return 0
        if run["state"] == "succeeded":
            print(f"ranks ran with different NCCL_MAX_NCHANNELS {values} and did not hang")
            return 2
        if "time" in errors.lower():
            print(f"hung until the job's timeout ({values}): {errors[:200]}")
            return 1
        print(f"run {run['state']} ({values}): {errors[:200]}")
        return 1
    if what == "trigger":
        for inv in doc:
            if inv.get("trigger_run_id") == args[0]:
                print(inv["id"])
                return 0
        return 1
    if what == "investigation":
        a = doc["analysis"]
        nodes = [n.get("hostname") or n.get("name") for n in doc.get("nodes", [])]
        single = [c for c in a.get("culprits", []) if c.get("kind") == "node" and len(c.get("members", [])) == 1]
        summary = a.get("summary", "")
        line = f"{doc['state']}, {a['verdict']}: {summary}"
        if doc["state"] != "done" or a["verdict"] != "inconclusive":
            print(f"expected a finished, inconclusive investigation: {line}")
            return 1
        if single:
            print(f"a single node was blamed: {single[0]['members']} ({line})")
            return 1
        if "two" not in summary or "pair" not in summary:
            print(f"the summary does not say two nodes give one pair: {line}")
            return 1
        print(f"{line} (nodes {nodes})")
        return 0
    if what == "reason-codes":
        codes = sorted({x.get("code") or x.get("basis") or "" for _, v in verdicts(doc) for x in v.get("reasons", [])})
        print(" ".join(codes) or "none")
        return 0
    if what == "hung-lines":
        lines = []
        for r in doc.get("results", []):
            hung = (r.get("summary") or {}).get("hung") or {}
            msgs = [x["message"] for x in (r.get("verdict") or {}).get("reasons", []) if x.get("code") == "hung"]
            lines.append(f"{r['hostname']}: {r['outcome']}, stage {hung.get('stage', '-')}, silent {hung.get('silent_s', '-')} s "
                         f"(limit {hung.get('limit_s', '-')} s): {msgs[0] if msgs else (r.get('reason') or '')[:160]}")
        print("; ".join(lines) or "no results")
        return 0
    if what == "observed-job":
        # `heddle --json workloads ls`: the job's processes, finished, with the node's environment
        # (env_applied set): one job (torchrun:<uid>:<run id>, or the scheduler's) of both
        # processes, or, from a build that does not know torchrun's run id, one per process.
        done = [j for j in doc if j.get("finished") and j.get("env_applied")]
        procs = sum(j.get("processes", 0) for j in done)
        if procs < 2:
            return 1
        print("; ".join(f"{j['job_key']} {j['processes']} process(es), {j['communicators']} communicator(s), "
                        f"env {j['env_applied'][:12]}, verdict {j['verdict']} {[x.get('code') for x in j.get('reasons', [])]}"
                        for j in done))
        return 0
    print(f"unknown question {what}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
