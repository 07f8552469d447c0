#!/usr/bin/env python3
"""One iperf3 TCP run between two pod namespaces, for the tunnel benchmarks.

    iperf_cpu.py <client ns> <server ns> <server address> <seconds> [tunnel pid ...]

Prints one line: Gbit/s received; the tunnel processes' CPU seconds per Gbit carried ("-" when
no process carries it, as for a kernel device); iperf3's share of the machine (all cores,
client and server); the share of the machine busy in all (whatever else it runs included).
"""
import json
import os
import subprocess
import sys
import time

client_ns, server_ns, address, secs = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
tunnels = [int(p) for p in sys.argv[5:]]
hz = os.sysconf("SC_CLK_TCK")
ncpu = os.cpu_count()


def ticks(pid):
    """User and system ticks of process pid, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def busy():
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + cpu[4]
    return sum(cpu[:8]) - idle, sum(cpu[:8])


def iperf3(ns, args):
    return subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


server = iperf3(server_ns, ["-s", "-1", "-B", address])
time.sleep(0.3)
t0 = [ticks(p) for p in tunnels]
b0, a0 = busy()
client = iperf3(client_ns, ["-c", address, "-t", str(secs), "-J"])
out, _ = client.communicate()
b1, a1 = busy()
t1 = [ticks(p) for p in tunnels]
server.wait(timeout=30)
res = json.loads(out)
if "error" in res:
    sys.exit(f"iperf3: {res['error']}")
bps = res["end"]["sum_received"]["bits_per_second"]
gbit = bps * secs / 1e9
cpu_client = res["end"]["cpu_utilization_percent"]["host_total"] / 100 * secs
cpu_server = res["end"]["cpu_utilization_percent"]["remote_total"] / 100 * secs
tunnel_cpu = sum(b - a for a, b in zip(t0, t1)) / hz
per_gbit = f"{tunnel_cpu / gbit:.3f}" if tunnels and gbit > 0 else "-"
iperf_share = (cpu_client + cpu_server) / (secs * ncpu)
machine = (b1 - b0) / (a1 - a0) if a1 > a0 else 0
print(f"{bps / 1e9:8.3f} {per_gbit:>10} {100 * iperf_share:9.0f}% {100 * machine:9.0f}%")
