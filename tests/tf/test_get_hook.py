"""smd.get_hook in smdebug 1.0's TensorFlow form: get_hook(hook_type=None, json_config_path=None,
create_if_not_exists=False), hook_type one of "session", "keras", "estimator"."""

import json

import keras
import pytest

import smdebug.tensorflow as smd


@pytest.fixture(autouse=True)
def no_hook():
    smd.del_hook()
    yield
    smd.del_hook()


def _config(tmp_path, name):
    path = tmp_path / f"{name}.json"
    config = {"LocalPath": str(tmp_path / name), "HookParameters": {"save_interval": "1"}}
    path.write_text(json.dumps(config))
    return str(path)


def test_get_hook_by_hook_type(tmp_path, data):
    assert smd.get_hook(hook_type="session") is None
    session = smd.get_hook(
        hook_type="session", json_config_path=_config(tmp_path, "s"), create_if_not_exists=True
    )
    assert isinstance(session, smd.SessionHook)
    assert smd.get_hook() is session  # no hook_type: whichever hook is in use
    assert smd.get_hook("session") is session
    assert smd.get_hook("keras") is None  # not a KerasHook
    session.close()

    hook = smd.get_hook("keras", _config(tmp_path, "k"), create_if_not_exists=True)
    assert isinstance(hook, smd.KerasHook)
    x, y = data
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, keras.utils.to_categorical(y, 3), batch_size=16, epochs=1, verbose=0, callbacks=[hook])
    assert smd.create_trial(str(tmp_path / "k")).steps() == [0, 1]

    with pytest.raises(NotImplementedError, match="tf.estimator"):
        smd.get_hook(hook_type="estimator", create_if_not_exists=True)
    with pytest.raises(ValueError, match="hook_type.*'sesion'"):
        smd.get_hook(hook_type="sesion")
