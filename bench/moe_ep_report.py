#!/usr/bin/env python3
"""The results of bench/moe_ep.sh as markdown on stdout (bench/results/moe-ep-cpu.md): reads, per
layout (np x expert parallel) and round, fsdp-train's JSONL log (NAME.jsonl) and its output
(NAME.txt: the summary line and each rank's "rank R maxrss_kb N" from GNU time), NAME =
np{np}_ep{ep}_r{round}; and the Chrome traces of a separate 2-step run whose step 1 was profiled
(np{np}_ep{ep}_prof/trace_rankR.json).

  - ms/step: the mean over steps 1.. (step 0 warms up), the better of the rounds; the ratio against FSDP alone at the same np (its ms / the layout's ms),
    of the better rounds and of each round's own pair (a shared machine's load moves between runs);
  - peak RSS per rank, and the summary line's memory plan against rank 0's run;
  - communication: FSDP's all-gather bytes per step (the summary line), and in the profiled step
    each rank's all-to-all calls, the bytes it handed them (its own block included) and their time
    on the communication thread (the wait for the slowest peer included), beside every collective's;
  - the losses of round 1 side by side; every layout's must equal np 1's within 1e-6 relative, and
    each layout's the same in every round. Exits 1, after printing, where they do not.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

TOL = 1e-6


def read_jsonl(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def mean_ms(rows, steps):
    timed = [r["step_ms"] for r in rows if r["step"] >= 1]
    return sum(timed) / len(timed)


def traces(prof):
    """Per rank: (all-to-all calls, bytes, ms; every collective's ms) in the profiled step."""
    out = []
    for path in sorted(glob.glob(os.path.join(prof, "trace_rank*.json")),
                       key=lambda p: int(re.search(r"rank(\d+)", p).group(1))):
        events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        a2a = [e for e in events if e["name"].endswith((":all_to_all_v", ":all_to_all_single"))]
        coll = [e for e in events if re.match(r"^(gloo|mpi|nccl):", e["name"])]
        out.append((len(a2a), sum(e["args"].get("bytes", 0) for e in a2a), sum(e["dur"] for e in a2a) / 1e3,
                    sum(e["dur"] for e in coll) / 1e3))
    return out


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ("--log", "--layouts", "--load-start", "--load-end", "--command", "--commit", "--model"):
        p.add_argument(flag, required=True)
    for flag in ("--rounds", "--steps", "--seq", "--global-batch"):
        p.add_argument(flag, type=int, required=True)
    a = p.parse_args()
    layouts = [tuple(int(x) for x in s.split("x")) for s in a.layouts.split()]
    tokens = a.global_batch * a.seq

    def name(np_, ep, r):
        return os.path.join(a.log, f"np{np_}_ep{ep}_r{r}")

    ms, logs, txt = {}, {}, {}
    for lay in layouts:
        for r in range(1, a.rounds + 1):
            base = name(*lay, r)
            logs[lay, r] = read_jsonl(base + ".jsonl")
            txt[lay, r] = open(base + ".txt").read()
            ms[lay, r] = mean_ms(logs[lay, r], a.steps)
    best = {lay: min(range(1, a.rounds + 1), key=lambda r: ms[lay, r]) for lay in layouts}

    def label(lay):
        np_, ep = lay
        if ep == 1:
            return f"np {np_}, FSDP alone" if np_ > 1 else "np 1"
        return f"np {np_}, EP {ep}" + (f" x FSDP {np_ // ep}" if np_ > ep else "")

    def ratio(lay, r=None):  # FSDP alone's ms / this layout's, at the same np
        fsdp = (lay[0], 1)
        if lay[0] == 1:
            return None
        if r is None:
            return ms[fsdp, best[fsdp]] / ms[lay, best[lay]]
        return ms[fsdp, r] / ms[lay, r]

    def summary(lay):
        m = re.search(r"summary \|.*", txt[lay, best[lay]])
        return m.group(0) if m else ""

    def rss(lay):
        kb = sorted((int(r), int(k)) for r, k in re.findall(r"rank (\d+) maxrss_kb (\d+)", txt[lay, best[lay]]))
        return " / ".join(f"{k / 1e6:.2f}" for _, k in kb)

    def experts_per_rank(lay):
        m = re.search(r"EP \d+ x FSDP \d+: (\d+) experts per rank \(of (\d+)\)", txt[lay, 1])
        if m:
            return f"{m.group(1)} of {m.group(2)}"
        m = re.search(r"experts +\| (\d+) per MoE block", txt[lay, 1])
        return ("all " + m.group(1) + (f", sharded over {lay[0]}" if lay[0] > 1 else "")) if m else "?"

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal")) / 1048576
    import datetime
    print("# CPU: expert parallel vs FSDP alone, a Qwen3-MoE at 1, 2 and 4 ranks, f32")
    print()
    print(f"Run: `{a.command}` (fsdp.cpp {a.commit}) on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}, "
          f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB; load average at the start {a.load_start}, at the end "
          f"{a.load_end}: a machine shared with other engineers' builds and tests, so the times are noisy "
          "(compare the rounds).")
    print(f"Model: {a.model}.")
    print(f"Every layout: scripts/fsdprun (Gloo), 1 thread per rank, fsdp-train's defaults (AdamW lr 3e-4, f32), "
          f"the same global batch of {a.global_batch} x {a.seq} = {tokens} tokens/step (each rank "
          f"{a.global_batch} / np rows), {a.steps} steps; FSDP alone: the experts fully_shard'ed with their "
          "blocks over every rank; EP N: each MoE's experts split over the N ranks of an `ep` group, tokens "
          "dispatched and combined by all-to-all, the experts fully_shard'ed over the np / N ranks that hold "
          "the same experts, everything else over the world.")
    print(f"ms/step: mean over steps 1..{a.steps - 1} (step 0 warms up), the better of {a.rounds} round(s), the "
          "layouts' order reversed every other round.")
    print()
    print("| layout | experts per rank | ms/step | tok/s | vs FSDP alone | rounds' own ratios | "
          "peak RSS per rank (GB) | plan (rank 0) | measured / plan: resident, allocated | "
          "persistent MB: plan, measured |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- | ---: | --- | --- |")
    off = []
    for lay in layouts:
        m = ms[lay, best[lay]]
        q = ratio(lay)
        own = ", ".join(f"{ratio(lay, r):.2f}x" for r in range(1, a.rounds + 1)) if q else "-"
        s = summary(lay)
        plan = re.search(r"plan ([0-9.]+) MB resident \(measured/plan ([0-9.]+)\), ([0-9.]+) MB allocated \(([0-9.]+)\)", s)
        pers = re.search(r"persistent mem / rank +\| ([0-9.]+) MB formula, ([0-9.]+) MB measured", txt[lay, best[lay]])
        if pers and rel(float(pers.group(1)), float(pers.group(2))) > 0.01:
            off.append(f"{label(lay)} ({float(pers.group(1)) / float(pers.group(2)):.3f})")
        print(f"| {label(lay)} | {experts_per_rank(lay)} | {m:.1f} | {tokens / m * 1e3:.1f} | "
              f"{f'{q:.2f}x' if q else '-'} | {own} | {rss(lay)} | "
              f"{plan.group(1) + ' MB' if plan else '?'} | {plan.group(2) + ', ' + plan.group(4) if plan else '?'} | "
              f"{pers.group(1) + ', ' + pers.group(2) if pers else '?'} |")
    print()
    print("\"vs FSDP alone\": FSDP alone's ms/step at the same np over the layout's (above 1: the layout is "
          "faster), each side's better round; the rounds' own ratios pair the two runs of one round. Peak RSS "
          "is each rank's ru_maxrss (/usr/bin/time %M) over the whole process, loading included; the plan is "
          "the meta-device memory plan of rank 0 (resident: with the process baseline and the allocator's "
          "cache; allocated: the allocator's own peak); persistent: the table's \"persistent mem / rank\" row, "
          "the plan's sharded parameters, gradients and AdamW moments against what the rank holds. "
          + (f"The plan's persistent bytes differ from the rank's by more than 1% at: {', '.join(off)} "
             "(plan / measured)." if off else "The plan's persistent bytes are the rank's (within 1%) everywhere."))
    print()
    print("## Communication per step")
    print()
    print("| layout | all-gather MB/step (FSDP) | FSDP's comm ms/step, exposed | all-to-all calls | "
          "all-to-all MB per rank | all-to-all ms per rank | all collectives ms per rank |")
    print("| --- | ---: | --- | ---: | --- | --- | --- |")
    for lay in layouts:
        s = summary(lay)
        ag = re.search(r"all-gather ([0-9.]+) MB/step", s)
        cm = re.search(r"comm ([0-9.]+) ms/step in collectives, ([0-9.]+) ms/step exposed", s)
        tr = traces(os.path.join(a.log, f"np{lay[0]}_ep{lay[1]}_prof")) if lay[0] > 1 else []
        calls = "/".join(str(c) for c in sorted({t[0] for t in tr})) or "-"
        cols = [" / ".join(f"{t[1] / 1e6:.2f}" for t in tr), " / ".join(f"{t[2]:.0f}" for t in tr),
                " / ".join(f"{t[3]:.0f}" for t in tr)]
        print(f"| {label(lay)} | {ag.group(1) if ag else '-'} | {cm.group(1) + ', ' + cm.group(2) if cm else '-'} | "
              f"{calls} | " + " | ".join(c or "-" for c in cols) + " |")
    print()
    print(f"All-gather MB/step and FSDP's comm (its groups' time on their communication threads, and the part "
          f"the compute thread waited for) are the summary line's means over steps 1..{a.steps - 1}; the "
          f"expert-parallel all-to-all is not among FSDP's groups, so it is not in them. The all-to-all columns "
          f"are from a run of its own, 2 steps of the same batch with step 1 profiled (`--profile-steps 1:2`; "
          f"apart from the timed runs, as the profiler's start copies 2 x 256 MiB to measure the memory "
          f"bandwidth, which would be in their peak RSS), rank by rank: its calls (the counts' "
          "all_to_all_single and the rows' all_to_all_v, forward and backward), the bytes each rank handed "
          "them (its own block included) and their time on the ep group's communication thread, which "
          "includes the wait for the slowest peer (the compute thread waits for each: a dispatch's rows are "
          "the experts' input); the last column is every collective of that step (Gloo), on every thread.")
    print()

    ref = logs[(1, 1), 1]
    worst_layout, worst = None, 0.0
    print("## Losses")
    print()
    print("| step | " + " | ".join(label(lay) for lay in layouts) + " | worst rel diff vs np 1 |")
    print("| ---: |" + " ---: |" * (len(layouts) + 1))
    for i, row in enumerate(ref):
        vals = [logs[lay, 1][i]["loss"] for lay in layouts]
        diff = max(rel(v, row["loss"]) for v in vals)
        if diff > worst:
            worst, worst_layout = diff, layouts[max(range(len(vals)), key=lambda k: rel(vals[k], row["loss"]))]
        print(f"| {row['step']} | " + " | ".join(f"{v:.7f}" for v in vals) + f" | {diff:.1e} |")
    print()
    repeat = all([x["loss"] for x in logs[lay, r]] == [x["loss"] for x in logs[lay, 1]]
                 for lay in layouts for r in range(1, a.rounds + 1))
    agree = worst <= TOL
    print(f"Round 1's losses (the cross-entropy plus 0.02 x the load-balancing loss over the global batch). "
          f"Worst relative difference against np 1: {worst:.1e}"
          f"{f' ({label(worst_layout)})' if worst_layout else ''}: "
          f"{'within' if agree else 'NOT within'} {TOL:g}. Every layout's losses are "
          f"{'the same' if repeat else 'NOT the same'} in every round.")
    print()
    print("## What these numbers can and cannot show")
    print()
    print(f"- The machine has {os.cpu_count()} cores shared with other engineers (the load average above). "
          "np 4 runs 4 single-threaded ranks on them: oversubscribed, so np 4's ms/step and tokens/s measure "
          "time-slicing, not scaling, and np 4 against np 2 or np 1 says nothing about more hardware. The "
          "ratios at one np compare layouts under the same oversubscription and are the closer comparison; "
          "still, where a rank waits for a descheduled peer, the collectives' times include the wait.")
    print("- Meaningful whatever the load: the experts per rank, the peak RSS per rank, the memory plan "
          "against it, FSDP's all-gather bytes and the all-to-all's bytes (the rows each rank sends its "
          "experts' ranks, which depend on the routing, not the speed), and the losses. At one np, EP N holds "
          "what FSDP alone holds of the experts (E / N of them sharded over np / N ranks: E / np experts' "
          "worth, the same persistent bytes); what it saves is the unsharded experts in flight (a block's "
          "E / N experts, against all E) and their all-gather and reduce-scatter traffic (none between "
          "ranks at N = np, where the experts' FSDP group is one rank: its \"all-gather\" is a copy, which "
          "the all-gather MB still count, as they count what the all-gathers write), for an all-to-all of "
          "the tokens' rows.")
    print("- Where the plan's persistent bytes are not the rank's (the last column of the first table), "
          "measured / plan is the plan's error, not the run's.")
    print("- np 1 against np 2 on these 2 shared cores: a rank's compute is not spread over more cores "
          "than the machine has free, so np 2 need not be faster than np 1 here.")
    print("- Over Gloo on one host an all-to-all is a memory copy through the loopback; on a cluster's "
          "network the bytes above, not these times, are what carries over.")
    print()
    for lay in layouts:
        if lay[1] > 1 or lay == (1, 1):
            print(f"## fsdp-train output, {label(lay)} (round {best[lay]})")
            print("```")
            for line in txt[lay, best[lay]].splitlines():
                if line.strip() and not re.match(r"^\[rank\d+\]:\s*$", line):
                    print(line)
            print("```")
    sys.stdout.flush()
    if not (agree and repeat):
        print(f"moe_ep_report: the losses disagree: worst {worst:.1e} against np 1 (tolerance {TOL:g}), "
              f"rounds repeat: {repeat}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
