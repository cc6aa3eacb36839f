#!/usr/bin/env python3
"""How busy the machine's cores were over a stretch of time, from /proc/stat (the whole machine: every process).

  scripts/cpu_busy.py start          prints a mark (the counters now)
  scripts/cpu_busy.py since MARK     prints one line: busy %, iowait %, cores, seconds since the mark

scripts/test prints it at the end: near 100 % busy means the run was CPU-bound (more processes side by side cannot
help, less work can); well below means it waited (on sleeps, containers, the network)."""
import os
import sys
import time


def counters():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, idle, iowait


def main(argv):
    if argv[:1] == ["start"]:
        print("%d:%d:%d:%f" % (*counters(), time.time()))
        return 0
    if len(argv) == 2 and argv[0] == "since":
        busy0, idle0, iowait0, t0 = (float(v) for v in argv[1].split(":"))
        busy, idle, iowait = counters()
        total = (busy - busy0) + (idle - idle0) + (iowait - iowait0)
        if total <= 0:
            print("test: no CPU time passed since the mark")
            return 0
        print("test: the %d cores were %.0f %% busy and %.0f %% in iowait over %.0f s (every process on the machine)"
              % (os.cpu_count() or 1, 100.0 * (busy - busy0) / total, 100.0 * (iowait - iowait0) / total,
                 time.time() - t0))
        return 0
    print("usage: cpu_busy.py start | since MARK", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
