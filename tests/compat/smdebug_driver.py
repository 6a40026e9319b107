"""Runs in the smdebug 1.0.34 venv (never imports this repo's code).

python smdebug_driver.py write ROOT                 write every scenario to ROOT/<scenario>
python smdebug_driver.py read OUT.json RUN [RUN...] describe each run as smdebug reads it, into OUT.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compat_scenarios  # noqa: E402

import smdebug  # noqa: E402
import smdebug.pytorch as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def main(argv):
    assert smdebug.__version__ == "1.0.34", smdebug.__version__
    assert not os.path.exists(os.path.join(os.path.dirname(smdebug.__file__), "hookspecs.py")), (
        smdebug.__file__
    )
    if argv[0] == "write":
        compat_scenarios.write_runs(smd, argv[1], argv[2:] or None)
    elif argv[0] == "read":
        seen = {run: compat_scenarios.describe(create_trial, smd.modes, run) for run in argv[2:]}
        with open(argv[1], "w") as f:
            json.dump(seen, f)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
