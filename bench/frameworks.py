"""TensorFlow and MXNet rows of the benchmark: step time with the hook against without it.

The driver half (``add_arguments``, ``bench``, ``report``) is called by bench/run.py (``--only tf,mxnet``);
the workload half runs in a framework's venv, as bench/workloads.py does:

    python bench/frameworks.py <tf_overhead|mxnet_overhead> '<json arguments>'

TensorFlow trains the small MLP of issue #13 (784-64-64-10 on 28x28x1, batch 32) under model.fit, compiled
with and without ``jit_compile``; MXNet the small MLP of issue #14 (the same 784-64-64-10, batch 32) and the
small CNN of the PyTorch rows (conv 8, conv 16, dense 64, dense 10, batch 32). Two identical copies in one
process, in alternating blocks of steps (the order flips every block), one of them with the hook. MXNet runs
side by side with the real smdebug 1.0.34; TensorFlow against no hook only (smdebug 1.0.34 refuses
TensorFlow >= 2.12).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = ("default", "raw", "reductions", "health")
LABEL = {
    "default": "(a) default config",
    "raw": "(b) weights+biases+gradients+losses, raw, every step",
    "reductions": "(c) as (b), reductions mean/max/l2 instead of raw",
    "health": "(d) health=True (every step's l2 norm and largest absolute value of each weight, gradient and "
    "the loss), default config otherwise",
}
OURS_ONLY = ("health",)  # smdebug 1.0.34 has no such mode
OURS, REF = "ours", "smdebug 1.0.34"
BATCH = 32


# -- driver (run.py's process) -----------------------------------------------------------------------
def add_arguments(ap) -> None:
    ap.add_argument("--tf-python", help="python of a venv with TensorFlow and our smdebug-tf")
    ap.add_argument("--mxnet-python", help="python of a venv with MXNet 1.9.1 and our smdebug-mxnet")
    ap.add_argument("--smdebug-mxnet-python", help="python of a venv with MXNet 1.9.1 and smdebug 1.0.34")


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _run(python: str, name: str, **args) -> dict:
    # one thread per framework, in both implementations alike (the machine's cores are shared)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "MXNET_CPU_WORKER_NTHREADS": "1",
    }
    env = {k: v for k, v in env.items() if not k.startswith(("SMDEBUG", "USE_SMDEBUG"))}
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), name, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} failed in {python} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def step_figures(res: dict) -> dict:
    """An overhead workload's figures (bench/run.py's rows too): the median over block pairs of hooked /
    plain time (robust to other load on the machine), the plain step and what the hook adds to it."""
    pairs = list(zip(res["hooked_s"], res["plain_s"]))
    return {
        "ratio": statistics.median(h / p for h, p in pairs),
        "plain_step_ms": 1000 * statistics.median(res["plain_s"]) / res["block"],
        "extra_ms": 1000 * statistics.median(h - p for h, p in pairs) / res["block"],
    }


def bench(only: set, args, tmp: str) -> dict:
    """{"tf": {impl: {config: [figures per round]}}, "mxnet": ...} for the frameworks asked for and given."""
    mxnet = {OURS: args.mxnet_python, REF: args.smdebug_mxnet_python}
    plans = {  # row key: (--only name, workload, its extra arguments, pythons)
        "tf": ("tf", "tf_overhead", {"jit_compile": False}, {OURS: args.tf_python}),
        "tf-xla": ("tf", "tf_overhead", {"jit_compile": True}, {OURS: args.tf_python}),
        "mxnet-mlp": ("mxnet", "mxnet_overhead", {"model": "mlp"}, mxnet),
        "mxnet": ("mxnet", "mxnet_overhead", {"model": "cnn"}, mxnet),
    }
    results: dict = {}
    for framework, (name, workload, extra, pythons) in plans.items():
        if name not in only:
            continue
        pythons = {impl: py for impl, py in pythons.items() if py}
        if OURS not in pythons:
            _log(f"{framework}: no --{name}-python given, rows skipped")
            continue
        out = results[framework] = {impl: {c: [] for c in CONFIGS} for impl in pythons}
        for r in range(args.rounds):
            for config in CONFIGS:
                items = [(i, py) for i, py in pythons.items() if i == OURS or config not in OURS_ONLY]
                for impl, python in items if r % 2 == 0 else items[::-1]:
                    res = _run(
                        python, workload, config=config, out_dir=f"{tmp}/{framework}-{impl[:4]}-{config}-{r}",
                        steps=args.steps, **extra,
                    )  # fmt: skip
                    fig = {**step_figures(res), "version": res["version"]}
                    out[impl][config].append(fig)
                    _log(
                        f"{framework:<6} {config:<10} {impl:<15} ratio {fig['ratio']:.3f} "
                        f"(plain step {fig['plain_step_ms']:.2f} ms, {fig['extra_ms']:+.2f} ms)"
                    )
    return results


def report(results: dict) -> str:
    """A markdown section for the rows measured (empty when none were)."""
    rows = []
    titles = (
        ("tf", "TensorFlow (Keras fit, MLP)"),
        ("tf-xla", "TensorFlow (Keras fit, MLP, jit_compile=True)"),
        ("mxnet-mlp", "MXNet (Gluon, MLP)"),
        ("mxnet", "MXNet (Gluon, CNN)"),
    )
    for framework, title in titles:
        per_impl = results.get(framework)
        if not per_impl:
            continue
        for config in CONFIGS:
            cells = []
            for impl in (OURS, REF):
                runs = per_impl.get(impl, {}).get(config)
                if not runs:
                    cells.append("—")
                    continue
                ratio = statistics.median(f["ratio"] for f in runs)
                extra = statistics.median(f["extra_ms"] for f in runs)
                cells.append(f"{ratio:.3f} ({extra:+.2f} ms)")
            plain = statistics.median(f["plain_step_ms"] for f in per_impl[OURS][config])
            rows.append(f"| {title} | {LABEL[config]} | {plain:.2f} | {cells[0]} | {cells[1]} |")
    if not rows:
        return ""
    versions = sorted(
        {f["version"] for fw in results.values() for c in fw.values() for r in c.values() for f in r}
    )
    return "\n".join(
        [
            "",
            "## TensorFlow and MXNet: step time with the hook / without (medians)",
            "",
            "Two identical models in one process, alternating blocks of steps; ratio = hooked / plain block "
            "time (the extra time per step in brackets). TensorFlow against no hook only (smdebug 1.0.34 refuses "
            "TensorFlow >= 2.12); its targets (issue #13): (a) <= 1.02, (b) <= 1.3, with and without "
            "jit_compile. MXNet's targets (issue #14, on the MLP): (a) <= 1.02, (b) <= 1.5 and at most a quarter of "
            f"smdebug 1.0.34's overhead. Rows (d), ours only (smdebug 1.0.34 has no health mode): health=True "
            "every step against no hook (issue #30 states them, with no target). "
            f"Versions: {', '.join(versions)}.",
            "",
            f"| framework | configuration | plain step (ms) | {OURS} | {REF} |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


# -- workloads (a framework's venv) ------------------------------------------------------------------
def _implementation(framework: str) -> str:
    from importlib import metadata

    try:
        return f"smdebug {metadata.version('smdebug')} + {framework}"
    except metadata.PackageNotFoundError:
        return f"ours {metadata.version('smdebug-core')} + {framework}"


def _hook_kwargs(smd, config: str) -> dict:
    every_step = dict(
        include_collections=["weights", "biases", "gradients", "losses"],
        save_config=smd.SaveConfig(save_interval=1),
    )
    if config == "default":
        return {}
    if config == "raw":
        return every_step
    if config == "health":
        return dict(health=True)
    if config == "reductions":
        return dict(
            every_step, reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"])
        )
    raise ValueError(f"unknown hook config {config!r}")


def _alternate(plain_block, hooked_block, steps: int, block: int) -> tuple[list, list]:
    plain_s, hooked_s = [], []
    for b in range(steps // block):
        order = [(plain_block, plain_s), (hooked_block, hooked_s)]
        for fn, times in order if b % 2 == 0 else order[::-1]:
            times.append(fn(b))
    return plain_s, hooked_s


def tf_overhead(
    config: str, out_dir: str, steps: int = 300, block: int = 20, warmup: int = 2, jit_compile: bool = False
) -> dict:
    """Keras fit of a small MLP, ``block`` steps per fit call; a block's time runs from its first step's
    start to its last step's end (callbacks included, fit's set-up not)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import smdebug.tensorflow as smd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    layers = keras.layers

    def mlp():
        model = keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                layers.Flatten(),
                layers.Dense(64, activation="relu"),
                layers.Dense(64, activation="relu"),
                layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
        return model

    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * BATCH, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=8 * BATCH)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    plain, hooked = mlp(), mlp()
    hooked.set_weights(plain.get_weights())
    hook = smd.KerasHook(out_dir=out_dir, **_hook_kwargs(smd, config))

    class Mark(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.first = self.last = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.first = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.last = time.perf_counter()

    def runner(model, callbacks):
        start, end = Mark(), Mark()

        def fit(_b):
            model.fit(data, epochs=1, steps_per_epoch=block, callbacks=[start, *callbacks, end], verbose=0)
            return end.last - start.first

        return fit

    plain_block, hooked_block = runner(plain, []), runner(hooked, [hook])
    for b in range(warmup):
        plain_block(b)
        hooked_block(b)
    plain_s, hooked_s = _alternate(plain_block, hooked_block, steps, block)
    t0 = time.perf_counter()
    hook.close()
    return {
        "plain_s": plain_s,
        "hooked_s": hooked_s,
        "close_s": time.perf_counter() - t0,
        "block": block,
        "version": _implementation(f"TensorFlow {tf.__version__}"),
        "jit_compile": jit_compile,
    }


def mxnet_overhead(
    config: str, out_dir: str, steps: int = 300, block: int = 10, warmup: int = 20, model: str = "cnn"
) -> dict:
    """A Gluon loop (autograd.record, backward, Trainer.step); every block ends with mx.nd.waitall so that
    it counts the work MXNet's engine queued for it."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon

    import smdebug.mxnet as smd

    mx.random.seed(0)
    nn = gluon.nn

    def network():
        net = nn.Sequential()
        if model == "cnn":
            net.add(
                nn.Conv2D(8, 3, padding=1, activation="relu"),
                nn.MaxPool2D(2),
                nn.Conv2D(16, 3, padding=1, activation="relu"),
                nn.MaxPool2D(2),
            )
        net.add(nn.Flatten(), nn.Dense(64, activation="relu"))
        if model == "mlp":
            net.add(nn.Dense(64, activation="relu"))
        net.add(nn.Dense(10))
        net.initialize(mx.init.Xavier())
        return net

    rng = np.random.RandomState(0)
    batches = [
        (mx.nd.array(rng.randn(BATCH, 1, 28, 28)), mx.nd.array(rng.randint(0, 10, BATCH))) for _ in range(8)
    ]
    plain, hooked = network(), network()
    plain(batches[0][0]), hooked(batches[0][0])  # deferred initialisation: shapes known
    for p, h in zip(plain.collect_params().values(), hooked.collect_params().values()):
        h.set_data(p.data())
    hook = smd.Hook(out_dir, **_hook_kwargs(smd, config))

    def runner(net, register):
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
        if register:
            hook.register_block(net)
            hook.register_block(loss_fn)

        def run_block(b):
            t0 = time.perf_counter()
            for i in range(b * block, (b + 1) * block):
                x, y = batches[i % len(batches)]
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                trainer.step(BATCH)
            mx.nd.waitall()
            return time.perf_counter() - t0

        return run_block

    plain_block, hooked_block = runner(plain, False), runner(hooked, True)
    for b in range(max(1, warmup // block)):
        plain_block(b)
        hooked_block(b)
    plain_s, hooked_s = _alternate(plain_block, hooked_block, steps, block)
    t0 = time.perf_counter()
    hook.close()
    return {
        "plain_s": plain_s,
        "hooked_s": hooked_s,
        "close_s": time.perf_counter() - t0,
        "block": block,
        "version": _implementation(f"MXNet {mx.__version__}"),
        "model": model,
    }


WORKLOADS = {"tf_overhead": tf_overhead, "mxnet_overhead": mxnet_overhead}

if __name__ == "__main__":
    result = WORKLOADS[sys.argv[1]](**json.loads(sys.argv[2]))
    print(json.dumps(result))
