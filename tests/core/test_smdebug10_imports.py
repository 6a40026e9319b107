"""smdebug 1.0's ``smdebug.core`` import paths, used in its own analysis documentation."""

import subprocess
import sys

import smdebug


def test_smdebug_core_modes_is_our_modes():
    from smdebug.core.modes import ModeKeys

    assert ModeKeys is smdebug.modes.ModeKeys
    import smdebug.core.modes as core_modes

    assert core_modes.TRAIN is smdebug.modes.TRAIN


def test_smdebug_core_configs_and_collection_are_ours():
    from smdebug.core.collection import Collection, CollectionKeys
    from smdebug.core.reduction_config import ReductionConfig
    from smdebug.core.save_config import SaveConfig, SaveConfigMode

    assert SaveConfig is smdebug.SaveConfig and SaveConfigMode is smdebug.SaveConfigMode
    assert ReductionConfig is smdebug.ReductionConfig
    assert Collection is smdebug.Collection and CollectionKeys is smdebug.CollectionKeys


def test_import_smdebug_core_modes_in_a_fresh_interpreter():
    proc = subprocess.run(
        [sys.executable, "-c", "from smdebug.core.modes import ModeKeys; print(ModeKeys.EVAL.value)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2"
    assert "alias" not in proc.stderr


def test_modes_is_the_modes_enum():
    """The reference calls smdebug.modes "the modes enum" (smdebug 1.0's ModeKeys): it iterates,
    indexes, converts and isinstance-checks as one, and its members stay attributes."""
    from smdebug import modes

    assert list(modes) == [modes.TRAIN, modes.EVAL, modes.PREDICT, modes.GLOBAL] and len(modes) == 4
    assert modes["EVAL"] is modes.EVAL and modes(3) is modes.PREDICT
    assert modes.GLOBAL in modes and isinstance(modes.TRAIN, modes) and not isinstance("TRAIN", modes)
    assert modes.TRAIN is modes.ModeKeys.TRAIN and modes.to_mode("train") is modes.TRAIN


def test_smdebug_core_tensor_holds_step_state_and_tensor():
    """smdebug 1.0's analysis documentation: has_passed_step "returns smdebug.core.tensor.StepState"."""
    from smdebug.core.tensor import StepState, Tensor
    from smdebug.trials.tensor import StepState as ours
    from smdebug.trials.tensor import Tensor as our_tensor

    assert StepState is ours and Tensor is our_tensor
    assert {s.name for s in StepState} == {"UNAVAILABLE", "AVAILABLE", "NOT_YET_AVAILABLE"}
