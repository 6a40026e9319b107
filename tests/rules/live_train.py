"""A training script for the sidecar tests: ``python live_train.py OUT bad|good STEPS``.

Trains slowly (a pause per step) so that ``smdebug rules --watch`` can follow it; prints COMPLETED, or
STOPPED <step> <rule> when the hook stopped training.
"""

import sys
import time

from numpy_runs import make_hook, train

from smdebug.exceptions import StopTraining


def main(out, kind, steps):
    hook = make_hook(out)
    try:
        train(hook, lr=1e6 if kind == "bad" else 0.01, steps=steps, on_step=lambda _: time.sleep(0.15))
        print("COMPLETED", flush=True)
    except StopTraining as exc:
        print(f"STOPPED {hook.step} {exc.rule_name}", flush=True)
    finally:
        hook.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
