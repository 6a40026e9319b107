"""Read runs with whichever smdebug is installed and print them as JSON (names, steps per mode, values).

python compat_reader.py RUN_DIR...      (one JSON line: a list with one entry per run)
"""

import json
import sys

from smdebug import modes
from smdebug.trials import create_trial

REDUCTIONS = [("mean", False), ("max", False), ("min", True), ("l2", False)]


def read(run):
    trial = create_trial(run)
    found = {"steps": trial.steps(), "collections": {}, "tensors": {}}
    for name in ("weights", "biases", "gradients", "losses", "default", "first_layer"):
        try:
            found["collections"][name] = sorted(trial.collection(name).tensor_names)
        except Exception:
            pass
    for name in sorted(trial.tensor_names()):
        tensor = trial.tensor(name)
        entry = {
            "steps": tensor.steps(),
            "TRAIN": tensor.steps(mode=modes.TRAIN),
            "EVAL": tensor.steps(mode=modes.EVAL),
            "values": {},
        }
        for step in tensor.steps():
            try:
                entry["values"][str(step)] = tensor.value(step).tolist()
            except Exception:  # only reductions were saved
                entry["values"][str(step)] = {
                    f"{'abs_' if absolute else ''}{red}": float(
                        tensor.reduction_value(step, red, abs=absolute)
                    )
                    for red, absolute in REDUCTIONS
                }
        found["tensors"][name] = entry
    return found


print(json.dumps([read(run) for run in sys.argv[1:]]))
