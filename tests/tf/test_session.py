"""SessionHook on TF 1.x graphs: a MonitoredTrainingSession under tf.compat.v1.disable_eager_execution(),
in subprocesses (the other tests run eagerly), by the hook's arguments, its JSON configuration and with no
code change at all; smdebug 1.0.34 reads the run as we do."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_compat import _describe

from smdebug import modes
from smdebug.trials import create_trial

HERE = Path(__file__).parent
TRAIN, EVAL = modes.TRAIN, modes.EVAL
LR, MOMENTUM = 0.1, 0.9
KERNEL, BIAS = "dense/kernel:0", "dense/bias:0"
LOSS = "mean_squared_error/value:0"


def _run(args, env_extra=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMDEBUG")}
    env.update(env_extra or {}, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _train(out_dir, *config):
    proc = _run([sys.executable, str(HERE / "graph_train.py"), out_dir, *config])
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("session") / "run")
    return out, _train(out)


def test_monitored_training_session_saves_what_the_session_fetches(graph_run):
    out, got = graph_run
    trial = create_trial(out)
    assert trial.steps(mode=TRAIN) == [0, 1, 2, 3, 5]  # save_steps, in TRAIN mode
    assert trial.steps(mode=EVAL) == [0, 1]
    assert trial.tensor_names(collection="weights") == [KERNEL]
    assert trial.tensor_names(collection="biases") == [BIAS]
    assert trial.tensor_names(collection="losses") == [LOSS]
    assert trial.tensor_names(collection="metrics") == ["mae:0"]
    assert trial.tensor_names(collection="custom") == ["relu_out:0", "scaled:0"]  # a Tensor, an Operation
    assert sorted(trial.tensor_names(collection="optimizer_variables")) == [
        "dense/bias/Momentum:0",
        "dense/kernel/Momentum:0",
    ]
    grads = trial.tensor_names(collection="gradients")
    assert len(grads) == 2 and all(name.startswith("gradients/") for name in grads)
    # the values the script's own run calls fetched, step by step, in both modes
    for mode in ("TRAIN", "EVAL"):
        for step, (loss, hidden, mae, scaled) in enumerate(got["fetched"][mode]):
            if step not in trial.steps(mode=modes.ModeKeys[mode]):
                continue
            m = modes.ModeKeys[mode]
            assert trial.tensor(LOSS).value(step, mode=m) == np.float32(loss)
            np.testing.assert_array_equal(trial.tensor("relu_out:0").value(step, mode=m), np.float32(hidden))
            np.testing.assert_array_equal(trial.tensor("scaled:0").value(step, mode=m), np.float32(scaled))
            assert trial.tensor("mae:0").value(step, mode=m) == np.float32(mae)
    # weights as each step starts, the gradients computed with them, the optimizer's update after it
    xs, ys = np.array(got["xs"], np.float64), np.array(got["ys"], np.float64)
    grad_of = {trial.tensor(g).value(0, mode=TRAIN).shape: g for g in grads}
    for step in (0, 1, 2):
        w = trial.tensor(KERNEL).value(step, mode=TRAIN).astype(np.float64)
        b = trial.tensor(BIAS).value(step, mode=TRAIN).astype(np.float64)
        residual = xs @ w + b - ys
        np.testing.assert_allclose(
            trial.tensor(grad_of[(3, 1)]).value(step, mode=TRAIN), 2 * xs.T @ residual / len(xs), rtol=1e-4
        )
        np.testing.assert_allclose(
            trial.tensor(grad_of[(1,)]).value(step, mode=TRAIN), 2 * residual.sum(0) / len(xs), rtol=1e-4
        )
        accumulated = trial.tensor("dense/kernel/Momentum:0").value(step, mode=TRAIN)
        np.testing.assert_allclose(
            trial.tensor(KERNEL).value(step + 1, mode=TRAIN), w - LR * accumulated, rtol=1e-5
        )
    np.testing.assert_array_equal(trial.tensor(KERNEL).value(0, mode=TRAIN), np.full((3, 1), 0.5, np.float32))
    # reductions computed in the graph, named as smdebug 1.0 names them (the :0 kept)
    kernel = trial.tensor(KERNEL).value(2, mode=TRAIN)
    assert trial.tensor(KERNEL).reduction_value(2, "l2", mode=TRAIN) == pytest.approx(
        np.linalg.norm(kernel), 1e-6
    )
    assert trial.tensor(KERNEL).reduction_value(2, "mean", mode=TRAIN) == pytest.approx(kernel.mean(), 1e-6)
    assert any(n.endswith("/dense/kernel:0") for n in _stored_names(out))


def _stored_names(out):
    names = set()
    for path in Path(out, "index").rglob("*.json"):
        names.update(t["tensorname"] for t in json.loads(path.read_text())["tensor_payload"])
    return names


def test_only_due_steps_fetch_more_and_unfed_tensors_are_skipped(graph_run):
    out, got = graph_run
    # TRAIN 0-3 due, 4 not, 5 due (a run call feeding nothing), EVAL 0-1 due
    assert got["asked"] == [True, True, True, True, False, True, True, True]
    trial = create_trial(out)
    assert 5 in trial.tensor(KERNEL).steps(mode=TRAIN)  # variables need no feed
    for name in (LOSS, "relu_out:0", "mae:0", *trial.tensor_names(collection="gradients")):
        assert 5 not in trial.tensor(name).steps(mode=TRAIN)
    # gradients and optimizer variables are training-only
    for name in trial.tensor_names(collection="gradients") + trial.tensor_names(
        collection="optimizer_variables"
    ):
        assert trial.tensor(name).steps(mode=EVAL) == []


def test_session_hook_from_json_configuration(tmp_path):
    out = str(tmp_path / "run")
    config = tmp_path / "hook.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": out,
                "HookParameters": {"save_interval": "2"},
                "CollectionConfigurations": [
                    {"CollectionName": "gradients"},
                    {"CollectionName": "weights", "CollectionParameters": {"save_interval": "3"}},
                ],
            }
        )
    )
    got = _train(out, str(config))
    trial = create_trial(out)
    assert trial.tensor(KERNEL).steps(mode=TRAIN) == [0, 3]
    assert trial.tensor(LOSS).steps(mode=TRAIN) == [0, 2, 4]
    assert trial.tensor(LOSS).value(4, mode=TRAIN) == np.float32(got["fetched"]["TRAIN"][4][0])
    for name in trial.tensor_names(collection="gradients"):
        assert trial.tensor(name).steps(mode=TRAIN) == [0, 2, 4]
    assert trial.tensor_names(collection="custom") == []  # not included by the configuration


UNMODIFIED = textwrap.dedent(
    """
    import json
    import numpy as np
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(16, 3)).astype("float32")
    ys = rng.normal(size=(16, 1)).astype("float32")
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    w = tf.compat.v1.get_variable("dense/kernel", [3, 1])
    loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, w))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession() as sess:
        for _ in range(4):
            losses.append(float(sess.run([train_op, loss], feed_dict={x: xs, y: ys})[1]))
    print(json.dumps(losses))
    """
)


def test_zero_code_change_monitored_training_session(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(UNMODIFIED)
    out = str(tmp_path / "run")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": out,
                "HookParameters": {"save_interval": "2"},
                "CollectionConfigurations": [{"CollectionName": "weights"}, {"CollectionName": "gradients"}],
            }
        )
    )
    proc = _run([sys.executable, str(script)], {"SMDEBUG_CONFIG_FILE_PATH": str(config)}, cwd=tmp_path)
    losses = json.loads(proc.stdout.strip().splitlines()[-1])
    trial = create_trial(out)
    assert trial.steps() == [0, 2]
    assert trial.tensor_names(collection="weights") == [KERNEL]
    (grad,) = trial.tensor_names(collection="gradients")  # the script's optimizer, not wrapped by it
    assert trial.tensor(grad).value(2).shape == (3, 1)
    assert [float(trial.tensor(LOSS).value(s)) for s in (0, 2)] == [
        np.float32(losses[0]),
        np.float32(losses[2]),
    ]


GET_HOOK = textwrap.dedent(
    """
    import numpy as np
    import tensorflow as tf
    import smdebug.tensorflow as smd

    tf.compat.v1.disable_eager_execution()
    hook = smd.get_hook(hook_type="session", create_if_not_exists=True)  # smdebug 1.0's TF 1.x form
    assert isinstance(hook, smd.SessionHook), hook
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    w = tf.compat.v1.get_variable("dense/kernel", [3, 1])
    loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
    train_op = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    hook.set_mode(smd.modes.TRAIN)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        for _ in range(3):
            sess.run(train_op, feed_dict={x: np.ones((4, 3), np.float32)})
    """
)


@pytest.mark.parametrize(
    "get",
    [
        'smd.get_hook(hook_type="session", create_if_not_exists=True)',
        "smd.SessionHook.create_from_json_file()",
    ],
)
def test_get_hook_of_kind_session_under_a_hook_configuration(tmp_path, get):
    # the configuration activates a hook on import: get_hook, or the reference's create_from_json_file,
    # gives that one, now a SessionHook (a second hook of the same configuration would find its out_dir taken)
    script = tmp_path / "train.py"
    script.write_text(GET_HOOK.replace('smd.get_hook(hook_type="session", create_if_not_exists=True)', get))
    out = str(tmp_path / "run")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "LocalPath": out,
                "HookParameters": {"save_interval": "1"},
                "CollectionConfigurations": [{"CollectionName": "weights"}],
            }
        )
    )
    _run([sys.executable, str(script)], {"SMDEBUG_CONFIG_FILE_PATH": str(config)}, cwd=tmp_path)
    trial = create_trial(out)
    assert trial.steps(mode=TRAIN) == [0, 1, 2]
    assert trial.tensor_names(collection="weights") == [KERNEL]


PLAIN_SESSION = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import smdebug.tensorflow as smd

    tf.compat.v1.disable_eager_execution()
    hook = smd.SessionHook(out_dir=sys.argv[1], include_collections=["weights"])
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    w = tf.compat.v1.get_variable("dense/kernel", [3, 1])
    loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
    train_op = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(loss)
    with tf.compat.v1.Session() as sess:  # runs no SessionRunHook: the hook sees nothing
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            sess.run(train_op, feed_dict={x: np.ones((4, 3), np.float32)})
    hook.close()
    """
)


def test_a_plain_session_saves_nothing_and_the_hook_says_why(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SESSION)
    proc = _run([sys.executable, str(script), str(tmp_path / "run")])
    assert "SessionHook of" in proc.stderr and "saw no session" in proc.stderr
    assert "MonitoredTrainingSession (hooks=[hook])" in proc.stderr


SUMMARIES = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import smdebug.tensorflow as smd

    tf.compat.v1.disable_eager_execution()
    hook = smd.SessionHook(
        out_dir=sys.argv[1], export_tensorboard=True, save_config=smd.SaveConfig(save_interval=2),
        include_collections=["tensorflow_summaries"],
    )
    x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    w = tf.compat.v1.get_variable("dense/kernel", [3, 1])
    hidden = tf.matmul(x, w)
    loss = tf.reduce_mean(hidden ** 2)
    tf.compat.v1.summary.scalar("my_loss", loss)
    tf.compat.v1.summary.histogram("my_hidden", hidden)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    losses = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], save_summaries_steps=None) as sess:
        for _ in range(4):
            losses.append(float(sess.run([train_op, loss], feed_dict={x: np.ones((5, 3), np.float32)})[1]))
    hook.close()
    print(json.dumps(losses))
    """
)


def test_tensorflow_summaries_go_to_tensorboard_at_the_save_steps(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SUMMARIES)
    out = tmp_path / "run"
    losses = json.loads(_run([sys.executable, str(script), str(out)]).stdout.strip().splitlines()[-1])
    scalars, histograms = {}, {}
    for path in (out / "tensorboard" / "GLOBAL").glob("*.tfevents"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "my_loss":
                    scalars[event.step] = value.simple_value
                elif value.tag == "my_hidden":
                    histograms[event.step] = value.histo.num
    # the graph's own summaries, as TensorFlow computed them in the step's run call, at the saved steps
    assert scalars == {0: np.float32(losses[0]), 2: np.float32(losses[2])}
    assert histograms == {0: 5, 2: 5}
    assert not (out / "index").exists()  # written to TensorBoard only, as smdebug 1.0 does


def test_smdebug_1_0_34_reads_a_graph_mode_run_as_we_do(graph_run):
    python = os.environ.get("SMDEBUG_1034_PYTHON")
    if not python or not os.path.exists(python):
        pytest.fail(
            "SMDEBUG_1034_PYTHON must name the python of a venv with smdebug 1.0.34: run `nox -s tests-tf`"
        )
    out, _ = graph_run
    theirs = _describe(python, out)
    ours = _describe(sys.executable, out)
    assert KERNEL in theirs["tensor_names"] and "relu_out:0" in theirs["tensor_names"]
    assert theirs["collections"]["custom"] == ["relu_out:0", "scaled:0"]
    assert set(theirs["tensors"][KERNEL]["TRAIN/0"][3]) == {"mean", "l2"}  # stored reductions, :0 kept
    assert theirs == ours


HEALTH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    import smdebug.tensorflow as smd

    out_dir, fault = sys.argv[1], sys.argv[2]
    hook = smd.SessionHook(out_dir=out_dir, health=True, save_config=smd.SaveConfig(save_interval=100))
    x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
    y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
    w = tf.compat.v1.get_variable("dense/kernel", [3, 1], initializer=tf.compat.v1.initializers.constant(0.5))
    step = tf.compat.v1.train.get_or_create_global_step()
    hit = tf.logical_and(tf.equal(step, 3), fault == "gradient")

    @tf.custom_gradient
    def poisoned(t):  # a NaN in the kernel's gradient at step 3
        return tf.identity(t), lambda dy: tf.where(hit, dy * np.nan, dy)

    loss = tf.compat.v1.losses.mean_squared_error(y, tf.matmul(x, poisoned(w.read_value())))
    optimizer = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    (grad, _), = optimizer.compute_gradients(loss, [w])
    before = tf.identity(w.read_value())
    with tf.control_dependencies([before]):
        train_op = optimizer.apply_gradients([(grad, w)], global_step=step)
    rng = np.random.default_rng(0)
    norms = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        for i in range(6):
            xs = rng.normal(size=(8, 3)).astype("float32")
            if fault == "input" and i == 3:
                xs[2, 1] = np.nan
            feed = {x: xs, y: rng.normal(size=(8, 1)).astype("float32")}
            norms.append(float(np.linalg.norm(sess.run([train_op, before], feed_dict=feed)[1])))
    print(json.dumps({"grad": grad.name, "norms": norms}))
    """
)


@pytest.mark.parametrize(
    "fault, direction, module", [("gradient", "backward", "dense"), ("input", "input", "x")]
)
def test_session_hook_health(tmp_path, fault, direction, module):
    script = tmp_path / "train.py"
    script.write_text(HEALTH_SCRIPT)
    out = str(tmp_path / "run")
    proc = _run([sys.executable, str(script), out, fault])
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    trial = create_trial(out)
    first = trial.first_nonfinite()
    tensor = printed["grad"] if fault == "gradient" else "x:0"
    assert {k: first[k] for k in ("step", "direction", "module", "tensor", "worker")} == {
        "step": 3,
        "direction": direction,
        "module": module,
        "tensor": tensor,
        "worker": "worker_0",
    }
    for step in range(3):  # the recorder's steps before, as reductions
        assert trial.tensor(KERNEL).reduction_value(step, "l2") == pytest.approx(printed["norms"][step])
        assert np.isfinite(trial.tensor(LOSS).reduction_value(step, "max", abs=True))


MEDIANS = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import smdebug.tensorflow as smd

    tf.compat.v1.disable_eager_execution()
    hook = smd.SessionHook(
        out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1), include_collections=["custom"],
        reduction_config=smd.ReductionConfig(reductions=["median"], abs_reductions=["median"]),
    )
    x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
    hook.get_collection("custom").add(tf.identity(x * 1.0, name="y"))
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        for batch in ([5, 1, 3], [9, -7, 5, 3, 1], [1, 2, 3, 4], [4]):
            sess.run("y:0", feed_dict={x: np.array(batch, np.float32)})
    hook.close()
    """
)


def test_the_median_in_a_graph_is_numpys_for_odd_and_even_counts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(MEDIANS)
    _run([sys.executable, str(script), str(tmp_path / "run")])
    tensor = create_trial(str(tmp_path / "run")).tensor("y:0")
    for step, batch in enumerate(([5, 1, 3], [9, -7, 5, 3, 1], [1, 2, 3, 4], [4])):
        assert tensor.reduction_value(step, "median") == np.median(batch), step
        assert tensor.reduction_value(step, "median", abs=True) == np.median(np.abs(batch)), step


SECOND_SESSION = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    import smdebug.tensorflow as smd

    hook = smd.SessionHook(
        out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1), include_regex=["^later_regex"],
        include_collections=["weights", "gradients", "custom", "losses"],
    )
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    emb = tf.compat.v1.get_variable("emb", [4, 2], initializer=tf.compat.v1.initializers.constant(0.5))
    looked_up = tf.nn.embedding_lookup(emb, ids)
    loss = tf.compat.v1.losses.mean_squared_error(tf.zeros_like(looked_up), looked_up)
    feed = {ids: np.array([0, 2, 2], np.int64)}
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:  # steps 0, 1: no training
        for _ in range(2):
            sess.run(loss, feed_dict=feed)
    # the same graph, still open: what the script adds now is seen by the next session's begin
    hook.get_collection("custom").add(tf.reduce_max(looked_up, name="later_added"))
    tf.reduce_min(looked_up, name="later_regex")
    optimizer = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    (grad, _), = optimizer.compute_gradients(loss)  # a tf.IndexedSlices: the lookup's rows
    train_op = optimizer.apply_gradients([(grad, emb)])
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:  # steps 2, 3
        for _ in range(2):
            sess.run(train_op, feed_dict=feed)
    hook.close()
    print(json.dumps({"sparse": type(grad).__name__, "values": grad.values.name}))
    """
)


def test_a_second_session_on_the_same_graph_and_a_sparse_gradients_name(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SECOND_SESSION)
    out = str(tmp_path / "run")
    printed = json.loads(_run([sys.executable, str(script), out]).stdout.strip().splitlines()[-1])
    trial = create_trial(out)
    assert trial.steps() == [0, 1, 2, 3]
    # added to the graph (and to a collection) between the two sessions: saved by the second
    assert trial.tensor("later_added:0").steps() == [2, 3]
    assert trial.tensor("later_regex:0").steps() == [2, 3]
    # the sparse gradient by the name TensorFlow gives it (its values'), dense: the variable's shape
    assert printed["sparse"] == "IndexedSlices"
    assert trial.tensor_names(collection="gradients") == [printed["values"]]
    grad = trial.tensor(printed["values"])
    assert grad.steps() == [2, 3]
    for step in (2, 3):
        emb = trial.tensor("emb:0").value(step).astype(np.float64)
        rows = emb[[0, 2, 2]]  # the loss is the mean of their squares
        expected = np.zeros_like(emb)
        np.add.at(expected, [0, 2, 2], 2 * rows / rows.size)
        np.testing.assert_allclose(grad.value(step), expected, rtol=1e-5)
    np.testing.assert_allclose(
        trial.tensor("emb:0").value(3), trial.tensor("emb:0").value(2) - 0.1 * grad.value(2), rtol=1e-6
    )
