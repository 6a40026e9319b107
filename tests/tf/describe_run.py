"""Prints, as JSON, what the smdebug Trial API reads from a run: python describe_run.py RUN.

Runs under this repo's smdebug and under the real smdebug 1.0.34 (imports nothing else but numpy).
"""

import json
import sys

import numpy as np

from smdebug import modes
from smdebug.trials import create_trial


def describe(path):
    trial = create_trial(path)
    all_modes = [modes.GLOBAL, modes.TRAIN, modes.EVAL, modes.PREDICT]
    out = {
        "workers": sorted(trial.workers()),
        "steps": {m.name: list(trial.steps(mode=m)) for m in all_modes},
        "tensor_names": sorted(trial.tensor_names()),
        "collections": {
            name: sorted(trial.tensor_names(collection=name)) for name in sorted(trial.collections())
        },
        "tensors": {},
    }
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        values = {}
        for m in all_modes[1:]:
            for step in tensor.steps(mode=m):
                a = np.asarray(tensor.value(step, mode=m))
                reductions = {
                    ("abs_" if absolute else "") + reduction: float(value)
                    for (reduction, absolute), value in tensor.reduction_values(step, mode=m).items()
                }
                values[f"{m.name}/{step}"] = [a.dtype.str, list(a.shape), a.tobytes().hex(), reductions]
        out["tensors"][name] = values
    return out


if __name__ == "__main__":
    print(json.dumps(describe(sys.argv[1])))
