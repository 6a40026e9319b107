"""SessionHook in TF 1.x code as legacy scripts write it: ``tf.compat.v1.disable_v2_behavior()``, whose
reference variables an optimizer updates in place, and two graphs trained one after the other, each by a
MonitoredTrainingSession of its own, with the same hook (one subprocess: the other tests run eagerly)."""

import json
import sys
import textwrap

import numpy as np
import pytest
from test_session import _run

from smdebug.trials import create_trial

LR = 0.1

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()  # reference variables, updated in place
    import smdebug.tensorflow as smd

    LR = 0.1

    hook = smd.SessionHook(
        out_dir=sys.argv[1],
        save_config=smd.SaveConfig(save_interval=1),
        reduction_config=smd.ReductionConfig(reductions=["max"], norms=["l2"], save_raw_tensor=True),
        include_collections=["weights", "gradients", "losses"],
    )
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(8, 3)).astype("float32")
    ys = rng.normal(size=(8, 1)).astype("float32")
    for _ in range(2):  # two graphs, one session each, the same hook
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
            w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.initializers.constant(0.5))
            loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, w))
            optimizer = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(LR))
            train_op = optimizer.minimize(loss)
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
                for _ in range(3):
                    sess.run(train_op, feed_dict={x: xs, y: ys})
    hook.close()

    def losses(hook):  # 4 steps and 2 evaluations of a fresh graph, unhooked or with a hook saving everything
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
            w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.initializers.constant(0.5))
            loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, w))
            optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
            train_op = (hook.wrap_optimizer(optimizer) if hook else optimizer).minimize(
                loss, global_step=tf.compat.v1.train.get_or_create_global_step()
            )
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook] if hook else []) as sess:
                seen = [float(sess.run([train_op, loss], feed_dict={x: xs, y: ys})[1]) for _ in range(4)]
                if hook:
                    hook.set_mode(smd.modes.EVAL)
                return seen + [float(sess.run(loss, feed_dict={x: xs, y: ys})) for _ in range(2)]

    every = smd.SessionHook(out_dir=sys.argv[1] + "-all", save_all=True, save_config=smd.SaveConfig(save_interval=2))
    hooked = losses(every)
    every.close()
    print(json.dumps({"xs": xs.tolist(), "ys": ys.tolist(), "unhooked": losses(None), "save_all": hooked}))
    """
)


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("legacy")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    out = str(tmp / "run")
    printed = json.loads(_run([sys.executable, str(script), out]).stdout.strip().splitlines()[-1])
    return out, np.array(printed["xs"], np.float64), np.array(printed["ys"], np.float64), printed


def test_reference_variables_are_saved_as_the_step_starts(legacy_run):
    out, xs, ys, _ = legacy_run
    trial = create_trial(out)
    (grad,) = trial.tensor_names(collection="gradients")
    kernel = trial.tensor("w:0")
    for first in (0, 3):  # each graph starts from its initializer
        np.testing.assert_array_equal(kernel.value(first), np.full((3, 1), 0.5, np.float32))
    for step in (0, 1, 2, 3, 4):
        w = kernel.value(step).astype(np.float64)
        # the step's gradient was computed with the weights saved at that step, which it then updated
        np.testing.assert_allclose(
            trial.tensor(grad).value(step), 2 * xs.T @ (xs @ w - ys) / len(xs), rtol=1e-4
        )
        if step != 2:
            np.testing.assert_allclose(
                kernel.value(step + 1), w - LR * trial.tensor(grad).value(step), rtol=1e-5
            )
        # the reductions are of the value saved (the graph computes both from one read)
        assert kernel.reduction_value(step, "max") == pytest.approx(w.max(), rel=1e-6)
        assert kernel.reduction_value(step, "l2") == pytest.approx(np.linalg.norm(w), rel=1e-6)


def test_two_graphs_one_after_the_other_continue_the_steps(legacy_run):
    out, xs, ys, _ = legacy_run
    trial = create_trial(out)
    assert trial.steps() == [0, 1, 2, 3, 4, 5]
    assert trial.tensor_names(collection="losses") == ["mean_squared_error/value:0"]
    loss = trial.tensor("mean_squared_error/value:0")
    for step in range(6):  # the loss of the weights saved at the step
        w = trial.tensor("w:0").value(step).astype(np.float64)
        assert loss.value(step) == pytest.approx(np.mean((xs @ w - ys) ** 2), rel=1e-5)


def test_save_all_does_not_change_training_nor_save_a_variable_twice(legacy_run):
    # save_all matches the initializers' Assign ops and the optimizer's updates, which TensorFlow does not
    # mark stateful: fetching one resets a variable in the middle of a step, or trains in an evaluation
    # step (smdebug 1.0.34 does both; the losses then differ)
    out, _, _, printed = legacy_run
    assert printed["save_all"] == printed["unhooked"]
    trial = create_trial(out + "-all")
    names = trial.tensor_names()
    assert {"w:0", "w/Adam:0", "global_step:0"} <= set(names)
    assert "w/Initializer/Const:0" in names  # what the call computes anyway is saved
    # a reference variable's own read is the variable, saved by its name (smdebug 1.0 names it so)
    assert "w/read:0" not in names and "w/Adam/read:0" not in names
    assert "w/Assign:0" not in names and "global_step/Assign:0" not in names  # the initializers
    assert "Adam/Assign:0" in names  # an update the step runs anyway (beta1_power's)


CONTROL_FLOW = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_v2_behavior()  # tf.cond and tf.while_loop build TF 1.x control flow (Switch, Enter)
    import smdebug.tensorflow as smd

    def losses(out_dir, **kwargs):  # 4 steps taking each branch in turn, unhooked (no out_dir) or hooked
        hook = out_dir and smd.SessionHook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), **kwargs)
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
            flag = tf.compat.v1.placeholder(tf.bool, [], name="flag")
            w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.initializers.constant(0.5))
            _, h = tf.while_loop(lambda i, a: i < 3, lambda i, a: (i + 1, a * 1.1), [0, tf.matmul(x, w)])
            loss = tf.cond(  # a tf.compat.v1.losses loss in each branch: the losses collection has both
                flag,
                lambda: tf.compat.v1.losses.mean_squared_error(y, tf.multiply(h, 2.0, name="doubled")),
                lambda: tf.compat.v1.losses.absolute_difference(y, h),
            )
            train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
            feed = {x: np.ones((2, 3), np.float32), y: np.zeros((2, 1), np.float32)}
            with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook] if hook else []) as sess:
                seen = [float(sess.run([train_op, loss], {**feed, flag: i % 2 == 0})[1]) for i in range(4)]
        if hook:
            hook.close()
        return seen

    out = sys.argv[1]
    print(json.dumps({
        "unhooked": losses(None),
        "default": losses(out + "-default"),
        "regex": losses(out + "-regex", include_regex=["doubled", "^gradients/", "^while/"]),
        "save_all": losses(out + "-all", save_all=True),
    }))
    """
)


def test_tf1_cond_and_while_loop_tensors_are_left_out_and_training_goes_on(tmp_path):
    # a tensor in a tf.cond branch has no value in a step taking the other branch, nor has a cond's
    # gradient before its Merge; one in a tf.while_loop's frame cannot be fetched at all: fetching them
    # made the script's own run call fail
    script = tmp_path / "train.py"
    script.write_text(CONTROL_FLOW)
    out = str(tmp_path / "run")
    proc = _run([sys.executable, str(script), out])
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert printed["default"] == printed["regex"] == printed["save_all"] == printed["unhooked"]
    assert "are not saved: a run call cannot always fetch them (inside a tf.cond" in proc.stderr
    assert "cond/mean_squared_error/value:0" in proc.stderr  # named
    assert create_trial(out + "-default").tensor_names() == []  # the losses, saved by default, are not
    names = create_trial(out + "-regex").tensor_names()
    assert "while/Exit_1:0" in names  # the loop's result
    # in a branch, a cond's gradient before its Merge, in the loop, in the gradient's loop
    assert not {"cond/doubled:0", "gradients/cond/doubled_grad/Mul:0"} & set(names)
    assert not {"while/mul:0", "gradients/while/mul_grad/Mul:0"} & set(names)
    assert "gradients/MatMul_grad/MatMul_1:0" in names  # after the loop and the cond's Merge
    everything = create_trial(out + "-all")
    assert {"w:0", "cond/Merge:0", "while/Exit_1:0", "x:0"} <= set(everything.tensor_names())
    assert everything.tensor("cond/Merge:0").steps() == [0, 1, 2, 3]
