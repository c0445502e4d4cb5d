"""How late a process sleeping 2 ms at a time wakes while three CPU-bound processes run, started
as specbench starts a server (a session of its own, `server._die_with_parent`): at nice 0, at nice
10 for the processes alone (before 2026-11-24 evening: Linux's autogroup ranks sessions by the
session's nice, so this ranked them below nothing), and at nice 10 for their session too (now). Run from the repository root: python benchmarks/cpu-replays/traces/send-lag/wake_lateness.py"""
import functools
import os
import subprocess
import sys
import time

from specbench.served.server import _die_with_parent

PROBE = """
import sys, time
end, late = time.perf_counter() + float(sys.argv[1]), []
while time.perf_counter() < end:
    due = time.perf_counter() + 0.002
    time.sleep(0.002)
    late.append(time.perf_counter() - due)
print(" ".join(f"{x:.6f}" for x in late))
"""



def process_nice_only() -> None:
    os.setsid()
    os.nice(10)


SETTINGS = {"nice  0": functools.partial(_die_with_parent, 0), "nice 10, processes only": process_nice_only,
            "nice 10, session too": functools.partial(_die_with_parent, 10)}
for name in list(SETTINGS) * 2:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=SETTINGS[name]) for _ in range(3)]
    time.sleep(1)
    wakes = [float(x) * 1e3 for x in subprocess.run([sys.executable, "-c", PROBE, "25"], capture_output=True,
                                                    text=True).stdout.split()]
    for hog in hogs:
        hog.kill()
        hog.wait()
    print(f"3 CPU-bound processes in a session of their own, {name:23s}: {len(wakes)} wakes in 25 s, "
          f"{sum(x > 1 for x in wakes)} more than 1 ms late, {sum(x > 5 for x in wakes)} more than 5 ms, "
          f"latest {max(wakes):.1f} ms", flush=True)
