"""One worker of a 2-worker dist_sync job (started by test_distributed.py with MXNet's DMLC_* variables).

python dist_worker.py OUT_DIR INCLUDE_WORKERS
"""

import json
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import smdebug.mxnet as smd

out_dir, include_workers = sys.argv[1], sys.argv[2]
kv = mx.kv.create("dist_sync")
hook = smd.Hook(
    out_dir,
    save_config=smd.SaveConfig(save_interval=1),
    include_collections=["weights", "losses"],
    include_workers=include_workers,
)
mx.random.seed(0)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(2))
net.initialize(mx.init.Xavier())
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
hook.register_block(net)
hook.register_block(loss_fn)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
rng = np.random.RandomState(10 + kv.rank)  # each worker its own batches
for _ in range(3):
    x, y = mx.nd.array(rng.randn(4, 3)), mx.nd.array(rng.randint(0, 2, 4))
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(4)
hook.close()
print(json.dumps({"rank": kv.rank, "weight": net[1].weight.data().asnumpy().tolist()}))
