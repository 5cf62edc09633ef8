#!/usr/bin/env python3
"""report.py — docs/bench/results.json -> docs/bench/README.md + throughput/memory SVG plots.

Data flow: load results.json (written by run.py) -> per record size: one table of every case,
the derived ratios, the targets marked PASS/MISS with their numbers, where the CPU went
(sluice's threads, the broker, ClickHouse) -> throughput-<size>.svg (MB/s of JSON over time,
from the count()/progress series, 2 s sliding window) and memory-<size>.svg (RSS over time per
process) -> README.md. Can be re-run alone: `python3 scripts/bench/report.py [DIR]`.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svg import line_chart  # noqa: E402

COLORS = {"raw_fetch": "#1f77b4", "raw_insert": "#7f7f7f", "sluice_eo": "#d62728",
          "sluice_alo": "#ff7f0e", "baseline": "#2ca02c"}
NAMES = {"raw_fetch": "raw broker fetch (raw_fetch)", "raw_insert": "raw ClickHouse insert",
         "sluice_eo": "sluice run, exactly-once", "sluice_alo": "sluice run, at-least-once",
         "baseline": "Python baseline (baseline.py)"}
PEERS = [("ClickPipes (ClickHouse Cloud)", "~63 MB/s per vCPU (JSON)", 63.0),
         ("clickhouse_sinker", "~13 k rows/s per core at 754 B rows (≈ 9.8 MB/s per core)", 9.8),
         ("Vector", "10–25 MiB/s per vCPU (≈ 10.5–26 MB/s)", 26.2)]


def rate_series(rows, avg, window=2.0):
    """Cumulative (t, rows) samples -> (t, MB/s): rows added in the last `window` seconds
    (linear interpolation between samples) times the average record size."""
    pts = [(0.0, 0)] + sorted(rows)

    def at(x):
        for (t0, n0), (t1, n1) in zip(pts, pts[1:]):
            if t0 <= x <= t1:
                return n0 + (n1 - n0) * ((x - t0) / (t1 - t0) if t1 > t0 else 1)
        return pts[-1][1]
    out = [(0.0, 0.0)]
    for t, n in pts[1:]:
        lo = max(0.0, t - window)
        if t > lo:
            out.append((t, (n - at(lo)) * avg / 1e6 / (t - lo)))
    return out


def val(v, nd=1):
    if v is None:
        return "–"
    return f"{v:,.{nd}f}" if isinstance(v, float) else f"{v:,}"


def mark(ok, text):
    return f"**{'PASS' if ok else 'MISS'}** {text}"


def size_section(s, cfg, out_dir):
    c, size = s["cases"], s["size"]
    L = [f"## {size} records: {s['records']:,} records, {s['bytes'] / 1e6:,.1f} MB of JSON "
         f"(avg {s['avg_record_bytes']:.0f} B), topic with {cfg['partitions']} partitions "
         f"(produced in {s['produce_seconds']} s)", "",
         "| case | records/s | MB/s | wall s | first row s | first→last MB/s | CPU s | CPU s/MB | µs/record "
         "| MB per CPU-s | peak RSS MiB | broker CPU s | ClickHouse CPU s | load 1m | check |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for k, r in c.items():
        cpu = r.get("cpu_seconds", r.get("client_cpu_seconds"))
        v = r["verify"]
        check = "ok" if v["ok"] else f"**FAILED** ({v.get('count')} of {v.get('expected')})"
        if k == "sluice_eo" and v["ok"]:
            check = f"ok, {v['distinct_offsets']:,} distinct offsets"
        L.append(f"| {NAMES[k]} | {val(r['records_per_s'])} | {val(r['mb_per_s'], 2)} "
                 f"| {val(r['seconds'])} | {val(r.get('time_to_first_row'))} "
                 f"| {val(r.get('first_to_last_mb_per_s'), 2)} | {val(cpu, 2)} "
                 f"| {val(r.get('cpu_s_per_mb'), 4)} | {val(r.get('us_per_record'), 2)} "
                 f"| {val(r.get('mb_per_cpu_s'))} | {val(r.get('peak_rss_mb'))} "
                 f"| {val(r['stack_cpu'].get('kafka'), 1)} | {val(r['stack_cpu'].get('chdb'), 1)} "
                 f"| {val(r.get('load_1m_before'), 2)} | {check} |")
    L += ["", "MB = 10⁶ bytes of JSON payload (Kafka record values). Wall seconds run from process "
          "start until the last row is visible (raw insert: from the first request, bodies built "
          "before); first row s: until the first row is visible (raw fetch: the first record "
          "fetched); first→last MB/s: the rate between those two moments. For the raw insert the CPU column is the raw_insert process's, reading and encoding before the clock included. Broker/ClickHouse "
          "CPU s: what the Kafka broker and the chDB server used during the case. Load 1m: the machine's "
          "1-minute load average just before the case started (2 cores; above 2 something else "
          "was competing for the CPU).", ""]

    eo, alo, bl = c.get("sluice_eo"), c.get("sluice_alo"), c.get("baseline")
    rf, ri = c.get("raw_fetch"), c.get("raw_insert")
    targets = []
    if eo:
        targets.append(mark(eo["mb_per_cpu_s"] >= 150,
                            f"sluice CPU ≥ 150 MB/s of JSON per core: {eo['mb_per_cpu_s']:.1f} MB per "
                            f"CPU-second (exactly-once; at-least-once {val(alo and alo['mb_per_cpu_s'])})"))
    if eo and rf and ri:
        lim = min(rf["mb_per_s"], ri["mb_per_s"])
        which = "broker fetch" if rf["mb_per_s"] <= ri["mb_per_s"] else "ClickHouse insert"
        ratio = eo["mb_per_s"] / lim
        steady = eo.get("first_to_last_mb_per_s")
        targets.append(mark(ratio >= 0.9, f"e2e ≥ 90 % of the slower raw limit: exactly-once "
                            f"{eo['mb_per_s']:.2f} MB/s = {ratio:.0%} of {lim:.2f} MB/s ({which}); "
                            f"first row → last row: {val(steady, 2)} MB/s vs raw fetch's "
                            f"{val(rf.get('first_to_last_mb_per_s'), 2)} MB/s"))
    if eo and alo:
        cost = 1 - eo["mb_per_s"] / alo["mb_per_s"]
        cpu_cost = eo["cpu_seconds"] / alo["cpu_seconds"] - 1
        targets.append(mark(cost <= 0.10, f"exactly-once costs ≤ 10 % vs at-least-once: throughput "
                            f"{cost:+.1%} ({eo['mb_per_s']:.2f} vs {alo['mb_per_s']:.2f} MB/s), "
                            f"CPU {cpu_cost:+.1%}, first row after {val(eo['time_to_first_row'])} vs "
                            f"{val(alo['time_to_first_row'])} s, first → last row "
                            f"{val(eo.get('first_to_last_mb_per_s'), 2)} vs "
                            f"{val(alo.get('first_to_last_mb_per_s'), 2)} MB/s"))
    bound = cfg["max_buffered_bytes"] / 2**20
    for r, n in ((eo, "exactly-once"), (alo, "at-least-once")):
        if r:
            targets.append(mark(r["peak_rss_mb"] <= bound, f"peak RSS within max_buffered_bytes "
                                f"({bound:.0f} MiB), {n}: {r['peak_rss_mb']:.1f} MiB"))
    if targets:
        L += ["Targets:", ""] + [f"- {t}" for t in targets] + [""]

    ratios = []
    if eo and bl:
        ratios.append(f"sluice (exactly-once) vs the Python baseline: {eo['mb_per_s'] / bl['mb_per_s']:.2f}× "
                      f"the throughput; the baseline burns {bl['cpu_seconds'] / eo['cpu_seconds']:.2f}× sluice's CPU "
                      f"({eo['mb_per_cpu_s']:.1f} vs {bl['mb_per_cpu_s']:.1f} MB per CPU-s), peak RSS "
                      f"{eo['peak_rss_mb']:.0f} vs {bl['peak_rss_mb']:.0f} MiB")
    if rf and ri:
        ratios.append(f"raw limits: broker fetch {rf['mb_per_s']:.2f} MB/s, ClickHouse insert "
                      f"{ri['mb_per_s']:.2f} MB/s ({ri['batches']} inserts)")
    for r, n in ((eo, "exactly-once"), (alo, "at-least-once")):
        if r and r.get("threads"):
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["threads"].items())[:5])
            ratios.append(f"sluice {n}, CPU seconds by thread: {top}")
    if eo:
        st = eo["stack_cpu"]
        busy = (st.get("kafka", 0) + st.get("chdb", 0) + eo["cpu_seconds"]) / eo["seconds"]
        ratios.append(f"during sluice exactly-once the machine's {'/'.join(f'{k} {v:.1f} s' for k, v in st.items())} "
                      f"+ sluice {eo['cpu_seconds']:.1f} s of CPU = {busy:.2f} cores busy on average "
                      f"(of {cfg.get('nproc', '?')})")
    if ratios:
        L += [f"- {x}" for x in ratios] + [""]

    thr = []
    for k, r in c.items():
        if r.get("rows_series"):
            thr.append((NAMES[k], rate_series(r["rows_series"], s["avg_record_bytes"]), COLORS[k]))
    mem = [(NAMES[k], r["mem_series"], COLORS[k]) for k, r in c.items() if r.get("mem_series")]
    for name, title, ylab, series in (
            ("throughput", f"Throughput, {size} records (2 s window)", "MB/s of JSON", thr),
            ("memory", f"Resident memory, {size} records", "RSS MiB", mem)):
        path = os.path.join(out_dir, f"{name}-{size}.svg")
        with open(path, "w") as f:
            f.write(line_chart(title, "seconds since the case started", ylab, series))
        L += [f"![{name} {size}]({name}-{size}.svg)", ""]
    return L


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "bench")
    res = json.load(open(os.path.join(out_dir, "results.json")))
    m, cfg = res["machine"], dict(res["config"], nproc=res["machine"]["nproc"])
    L = ["# sluice benchmark", "",
         "Generated by `make bench` (scripts/bench/run.py → results.json → scripts/bench/report.py); "
         "do not edit by hand. Re-render with `python3 scripts/bench/report.py`.", "",
         f"Run {res['run']} ({res['started']} → {res.get('finished', '?')}), sluice built from "
         f"{m.get('source', 'commit ' + m['git_commit'])} ({m['sluice']}). Machine: {m['nproc']} × {m['cpu_model']}, {m['mem_gb']} GB, Linux {m['kernel']}. "
         f"Kafka: {m['kafka']}; ClickHouse: {m['clickhouse']}; "
         f"{'a private stack started fresh for this run' if m.get('stack') == 'private' else 'the shared stack'}. Baseline: Python {m['python']}, "
         f"confluent-kafka {m['confluent_kafka']} (librdkafka {m['librdkafka']}), clickhouse-connect "
         f"{m['clickhouse_connect']}.", "",
         f"Load average (1 min) at start {res['load_start'][0]:.2f}, at end {res['load_end'][0]:.2f}; "
         "per case in results.json (`load_1m_before`). The broker, ClickHouse, the sink and the "
         "driver share the same 2 cores, and other work may run on the machine, so the numbers are "
         "noisy and the absolute rates are those of this local stack (one Apache Kafka JVM, chDB behind a "
         "Python HTTP server), not of a production cluster. The ratios are the point.", "",
         f"Setup: BENCH_MB={cfg['bench_mb']:g} per record size; one topic per size, "
         f"{cfg['partitions']} partitions, lz4; every case reads the same topic with its own group "
         f"into its own fresh table (ReplacingMergeTree(_offset) with the `_offset` minmax index and "
         f"the `watermark` projection, merges stopped so that a duplicate stays countable). Inserts: "
         f"{cfg['batch_rows']:,} rows or {cfg['batch_bytes'] >> 20} MiB per insert, {cfg['concurrency']} "
         f"at once. sluice: max_buffered_bytes = {cfg['max_buffered_bytes'] >> 20} MiB, "
         "fence_wait = 0s (a fresh group has no previous owner to wait out; the default would add "
         "insert_timeout + 5 s before the first write). The baseline is single-threaded: consume, "
         "insert JSONEachRow with clickhouse-connect (async_insert=0), commit, repeat.", ""]
    if res["failures"]:
        L += ["**FAILURES:**", ""] + [f"- {x}" for x in res["failures"]] + [""]
    for s in res["sizes"]:
        L += size_section(s, cfg, out_dir)
    L += ["## Peers' published figures (for reference, other hardware and setups)", "",
          "| system | published | vs sluice here (MB per CPU-s, exactly-once) |", "|---|---|---|"]
    for name, text, mbps in PEERS:
        here = ", ".join(f"{s['size']}: {s['cases']['sluice_eo']['mb_per_cpu_s']:.0f} "
                         f"({s['cases']['sluice_eo']['mb_per_cpu_s'] / mbps:.1f}×)"
                         for s in res["sizes"] if "sluice_eo" in s["cases"])
        L.append(f"| {name} | {text} | {here or '–'} |")
    L.append("")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(L))
    print(f"wrote {out_dir}/README.md and the plots")


if __name__ == "__main__":
    main()
