"""The line protocol a Rust bench drives a PyTorch peer with (benches/timing/peer.rs):
`setup ARGS` builds and warms up the variants and is answered `ready`; each `round` is
answered with one JSON object of median milliseconds per variant; `quit` ends it.
"""

import json
import statistics
import sys
import time

REPS = 3


def median_ms(f):
    """Median of REPS timed calls of f, after one untimed call."""
    f()
    times = []
    for _ in range(REPS):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def serve(setup):
    """Answers the bench on stdin/stdout; `setup(args)` returns {name: zero-argument fn}."""
    variants = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "setup":
            variants = setup(cmd[1:])
            for f in variants.values():
                f()
                f()
            print("ready", flush=True)
        elif cmd[0] == "round":
            print(json.dumps({k: median_ms(f) for k, f in variants.items()}), flush=True)
        elif cmd[0] == "quit":
            return
