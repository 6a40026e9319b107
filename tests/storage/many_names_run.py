"""Saves scalars through a hook with a 1 MiB queue bound, in a process of its own, and prints how much the
training process (and the writer process, when there is one) grew while it did: JSON on the last line.

usage: many_names_run.py OUT_DIR thread|process STEPS PER_STEP distinct|same
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time


def rss_kib(pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def main() -> None:
    out_dir, writer, steps, per_step, names = sys.argv[1:6]
    os.environ["SMDEBUG_WRITER_PROCESS"] = "1" if writer == "process" else "0"
    from smdebug.hook import BaseHook

    hook = BaseHook(out_dir=out_dir, max_queue_bytes=1 << 20)

    def step(names) -> None:
        for name in names:
            hook.save_scalar(name, 1.0)
        hook.end_step()
        hook.begin_step()

    warm_up = [f"warm_up_{k}" for k in range(int(per_step))]
    deadline = time.monotonic() + 60
    while writer == "process" and getattr(hook._writer, "_local", True) is not None:
        assert time.monotonic() < deadline, "the writer process never took over"
        step(warm_up)  # it starts after a few steps and takes over once it is ready
        time.sleep(0.01)
    for _ in range(1000):  # then runs a while: what it holds in any run is there before measuring
        step(warm_up)
    hook.wait_for_writer(60)
    child = getattr(hook._writer, "_proc", None)
    gc.collect()
    before = rss_kib(), rss_kib(child.pid) if child is not None else 0
    for s in range(int(steps)):
        first = s * int(per_step) if names == "distinct" else 0
        step([f"scalar_number_{i}" for i in range(first, first + int(per_step))])
    gc.collect()
    after = rss_kib(), rss_kib(child.pid) if child is not None else 0
    hook.close()
    grown = {"training_kib": after[0] - before[0], "child_kib": after[1] - before[1]}
    print(json.dumps({**grown, "child": child is not None}))


if __name__ == "__main__":
    main()
