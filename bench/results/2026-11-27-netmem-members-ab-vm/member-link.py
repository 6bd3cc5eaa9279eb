import sys, subprocess, json, os, time
sys.path.insert(0, "/work/main/bench/harness")
import netns
bins = sys.argv[1].split(",")
rounds = int(sys.argv[2]); rate = sys.argv[3]; bs = sys.argv[4]; qd = sys.argv[5]
netns.teardown()
netns.setup(1, rate)
try:
    res = {b: [] for b in bins}
    for r in range(rounds):
        for b in bins:
            m = netns.Member(f"/tmp/br/sluice-{b}", 1, "memory:512M", "/tmp/nm/member.log")
            subprocess.run(["fio", "--name=w", "--ioengine=nbd", f"--uri={m.uri}", "--rw=write", "--bs=1M",
                "--iodepth=8", "--size=256M", "--output-format=json"], capture_output=True, text=True, timeout=60, check=True)
            with open(f"/proc/{m.pid}/stat") as f:
                st = f.read().split(")")[1].split()
            cpu0 = (int(st[11]) + int(st[12])) / 100
            out = subprocess.run(["fio", "--name=j", "--ioengine=nbd", f"--uri={m.uri}", "--rw=randread", f"--bs={bs}",
                f"--iodepth={qd}", "--direct=1", "--time_based", "--runtime=8", "--size=256M", "--output-format=json"],
                capture_output=True, text=True, timeout=60); print(out.stderr[-2000:]) if not out.stdout.strip() else None
            txt = out.stdout; txt = txt[txt.index('{'):] if '{' in txt else txt
            try:
                j = json.loads(txt)
            except Exception:
                print(out.stdout[:1500], out.stderr[-1500:]); raise
            bw = j["jobs"][0]["read"]["bw_bytes"] / 1e6
            with open(f"/proc/{m.pid}/stat") as f:
                st = f.read().split(")")[1].split()
            cpu = (int(st[11]) + int(st[12])) / 100 - cpu0
            m.stop()
            res[b].append((round(bw), cpu))
            print(b, round(bw), "MB/s", cpu, "s cpu", flush=True)
    print(res)
finally:
    netns.teardown()
