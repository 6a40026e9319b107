"""Saves STEPS steps of one float32 tensor of MIB MiB through a hook with a BOUND-byte writer bound and
prints, as JSON on the last line, the most memory the process allocated beyond what it held before the
first measured step (tracemalloc's peak: numpy's arrays, the staged steps, the storage client's buffers).

usage: bound_run.py OUT_DIR STEPS MIB BOUND [--go FILE]

With --go it prints "trained" once the steps are saved and waits for FILE before closing the hook (the
test starts a stopped S3 server again meanwhile).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("steps", type=int)
    parser.add_argument("mib", type=float)
    parser.add_argument("bound", type=int)
    parser.add_argument("--go")
    args = parser.parse_args()
    from smdebug.hook import BaseHook

    value = np.arange(int(args.mib * 2**20) // 4, dtype=np.float32)
    hook = BaseHook(out_dir=args.out_dir, max_queue_bytes=args.bound)
    hook.begin_step()
    hook.save_tensor("warm_up", np.ones(3, np.float32))  # the store's client is made and used once
    hook.end_step()
    hook.begin_step()
    hook.wait_for_writer(60)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    longest = 0.0
    for _ in range(args.steps):
        began = time.monotonic()
        hook.save_tensor("big", value)
        hook.end_step()
        hook.begin_step()
        longest = max(longest, time.monotonic() - began)
    peak = tracemalloc.get_traced_memory()[1] - before
    if args.go:
        print("trained", flush=True)
        while not os.path.exists(args.go):
            time.sleep(0.05)
    hook.close()
    peak = max(peak, tracemalloc.get_traced_memory()[1] - before)
    print(json.dumps({"peak": peak, "longest_step_s": longest}))


if __name__ == "__main__":
    main()
