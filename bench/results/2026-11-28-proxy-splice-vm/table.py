#!/usr/bin/env python3
"""Prints the gateway rows of each run given (folders with gateway.csv) side by side:
the row's rate over the member's (min..max over the runs) and the gateway's CPU per GiB
or per I/O."""
import csv, sys

for folder in sys.argv[1:]:
    with open(f"{folder}/gateway.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["row"] != "member (sluice)"]
    print(f"## {folder}")
    for r in rows:
        cpu = r["gateway_cpu_s_per_gib"] if "1M" in r["job"] else r["gateway_cpu_us_per_io"]
        unit = "s/GiB" if "1M" in r["job"] else "us/IO"
        print(f"{r['job']:18} {r['row']:13} {float(r['ratio_to_member']):.2f}x ({r['ratio_runs_min_max']})  gw {float(cpu):.3f} {unit}")
