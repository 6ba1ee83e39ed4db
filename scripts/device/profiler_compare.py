#!/usr/bin/env python3
"""Compares what Heddle's NCCL profiler plugin wrote with what the job says it did.

    python3 profiler_compare.py --job with.json --spool /tmp/spool [--baseline without.json]

--job is profiler_overhead.py's output from the run with the plugin; --spool the directory
the plugin wrote to. For each rank (matched by pid) it reports:
  * operations and bytes per collective and size band, job vs plugin: these must match
    exactly (the job may not issue collectives the script does not count);
  * the plugin's GPU time per operation (exec_ns / exec_ops) against the job's own
    wall-clock time per operation for each size, in percent;
and with --baseline (the same script without the plugin) the job's time per size with
and without the plugin, in percent. Prints JSON; exits 1 when bytes or operations differ.
"""

import argparse
import glob
import json
import os
import sys


def load_spool(directory):
    files = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path) as f:
            doc = json.load(f)
        files[doc["job"]["pid"]] = doc
    return files


def plugin_rows(doc):
    rows = {}
    for comm in doc["comms"]:
        for b in comm["ops"]:
            key = (b["func"], b["size_band"])
            r = rows.setdefault(key, {"ops": 0, "bytes": 0, "exec_ops": 0, "exec_ns": 0})
            for k in r:
                r[k] += b.get(k, 0)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True)
    p.add_argument("--spool", required=True)
    p.add_argument("--baseline")
    p.add_argument("--time-tolerance-pct", type=float, default=5.0,
                   help="plugin GPU time vs job time per op, for sizes of 16 MiB and more")
    args = p.parse_args()
    job = json.load(open(args.job))
    spool = load_spool(args.spool)
    base = json.load(open(args.baseline)) if args.baseline else None
    report = {"ranks": [], "bytes_match": True, "time_within_tolerance": True}
    for rank in job["ranks"]:
        doc = spool.get(rank["pid"])
        entry = {"rank": rank["rank"], "pid": rank["pid"], "spool_file": doc is not None}
        if doc is None:
            report["bytes_match"] = False
            report["ranks"].append(entry)
            continue
        entry.update(final=doc["final"], dropped_events=doc["dropped_events"],
                     nccl_version=doc.get("nccl_version"), env_applied=doc.get("env_applied"),
                     nets=sorted({n["net"] for c in doc["comms"] for n in c.get("net", [])}))
        got = plugin_rows(doc)
        diffs = []
        for i in rank["issued"]:
            key = (i["func"], i["size_band"])
            g = got.get(key, {"ops": 0, "bytes": 0})
            if (g["ops"], g["bytes"]) != (i["ops"], i["bytes"]):
                diffs.append({"func": key[0], "size_band": key[1], "job": [i["ops"], i["bytes"]],
                              "plugin": [g["ops"], g["bytes"]]})
        extra = sorted(set(got) - {(i["func"], i["size_band"]) for i in rank["issued"]})
        entry["count_differences"] = diffs
        entry["plugin_only_rows"] = [{"func": f, "size_band": b, **got[(f, b)]} for f, b in extra]
        if diffs:
            report["bytes_match"] = False
        times = []
        base_rows = {}
        if base:
            for r in base["ranks"]:
                if r["rank"] == rank["rank"]:
                    base_rows = {(x["func"], x["bytes"]): x for x in r["results"]}
        for r in rank["results"]:
            g = got.get((r["func"], r["size_band"]), {})
            t = {"func": r["func"], "bytes": r["bytes"], "job_us": round(r["us_per_op"], 3)}
            if g.get("exec_ops"):
                plugin_us = g["exec_ns"] / g["exec_ops"] / 1e3
                t["plugin_gpu_us"] = round(plugin_us, 3)
                t["diff_pct"] = round(100 * (plugin_us - r["us_per_op"]) / r["us_per_op"], 2)
                if r["bytes"] >= 16 << 20 and abs(t["diff_pct"]) > args.time_tolerance_pct:
                    report["time_within_tolerance"] = False
            b = base_rows.get((r["func"], r["bytes"]))
            if b:
                t["baseline_us"] = round(b["us_per_op"], 3)
                t["overhead_pct"] = round(100 * (r["us_per_op"] - b["us_per_op"]) / b["us_per_op"], 2)
                t["busbw_GBps"] = [round(b["busbw_GBps"], 2), round(r["busbw_GBps"], 2)]
            times.append(t)
        entry["times"] = times
        report["ranks"].append(entry)
    print(json.dumps(report, indent=1))
    sys.exit(0 if report["bytes_match"] else 1)


if __name__ == "__main__":
    main()
