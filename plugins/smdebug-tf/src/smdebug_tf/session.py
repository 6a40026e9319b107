"""SessionHook: smdebug for TF 1.x graphs (``tf.compat.v1``) run by a MonitoredSession.

A ``tf.compat.v1.train.SessionRunHook``: each ``run`` call of the MonitoredSession is one step. In
``begin`` (the graph is still open) the hook finds the tensors of its collections, by smdebug 1.0's
graph-mode names (``dense/kernel:0``, the gradient tensors' own names, ...), and adds to the graph, for
each, the ops computing its reductions. At a step where some are due, ``before_run`` asks the step's own
run call to fetch them too (their reductions, their values where saved); other steps fetch nothing more.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from smdebug.plugin import CollectionKeys, ModeKeys
from smdebug_tf import graph as tfgraph
from smdebug_tf.packing import raw_value, reducible_in_graph, reduction_vector
from smdebug_tf.tensors import Captured
from smdebug_tf.tfhook import TFHook

_HEALTH = "smdebug/health"  # the health vector's key among a step's fetches (no tensor's name)


class Fetchable:
    """A tensor the hook may fetch: its value (``raw``) and the ops of its reductions (``vector``)."""

    __slots__ = ("tensor", "raw", "vector", "pairs", "sized", "empty", "host", "asked")

    def __init__(self, tensor, pairs: tuple):
        self.tensor = tensor
        self.asked = pairs
        self.host = not reducible_in_graph(tensor)  # complex, text: the core reduces the value
        self.raw = tensor if self.host else raw_value(tensor)
        self.pairs = () if self.host else pairs
        self.vector, self.sized, self.empty = reduction_vector(tensor, self.pairs)
        if self.vector is None:
            self.pairs = ()


class GraphState:
    def __init__(self):
        self.graph = None
        self.tensors: dict[str, Fetchable] = {}  # name -> what to fetch
        self.reach = None  # graph.Reach of the graph
        self.fetched: list[str] = []  # the names this step's run call fetches
        self.health = None  # with health=True: {"train": vector, "other": vector (no gradients)}, names
        self.health_fetched = False
        self.summaries: set[str] = set()  # names of the graph's summary ops the hook fetches


class SessionHook(TFHook, tf.compat.v1.train.SessionRunHook):
    # graph tensors are found by what they are (variables, the optimizer's gradients, the graph's
    # losses, what collections were given), not by the forms of names that Keras 3 runs use
    builtin_patterns = {}
    builtin_collections = (*TFHook.builtin_collections, CollectionKeys.TENSORFLOW_SUMMARIES)
    reduction_names_keep_index = True  # smdebug 1.0's TF form: smdebug/reductions/mean/dense/kernel:0

    def setup(self) -> None:
        super().setup()
        self.setup_graph()

    @classmethod
    def activated_as(cls, hook):
        from smdebug_tf.activation import session_hook_asked

        session_hook_asked()  # the hook activated on import, if no step used it yet, becomes a SessionHook
        return super().activated_as(hook)

    def setup_graph(self) -> None:
        """Also run on a hook made a SessionHook (activation): Keras' name patterns do not apply here."""
        self.graph_state = GraphState()
        for name, pattern in TFHook.builtin_patterns.items():
            coll = self.get_collection(name)
            if pattern in coll.include_regex:
                coll.include_regex = [p for p in coll.include_regex if p != pattern]
        self.collections_changed()

    # -- SessionRunHook --------------------------------------------------------------------------------
    def begin(self):
        if self.closed:
            return
        with self.guard("find the graph's tensors"):
            graph = tf.compat.v1.get_default_graph()
            if not graph.finalized:  # (again for a graph seen before: the script may have added to it)
                self.find_tensors(graph)

    def before_run(self, run_context):
        state = self.graph_state
        state.fetched = []
        state.health_fetched = False
        if self.closed:
            return None
        if not self.next_idle_step():
            self.begin_step()
        health = self.health_fetch(run_context.original_args)
        if (not self.anything_due() or not state.tensors) and health is None:
            return None
        with self.guard("choose the step's tensors"):
            fetches = self.fetches(run_context.original_args) if self.anything_due() else {}
            state.fetched = list(fetches)
            if health is not None:
                fetches[_HEALTH] = health
                state.health_fetched = True
            if fetches:
                return tf.compat.v1.train.SessionRunArgs(fetches)
        return None

    def after_run(self, run_context, run_values):
        state = self.graph_state
        if state.fetched or state.health_fetched:
            results = dict(run_values.results or {})
            health = results.pop(_HEALTH, None)
            with self.guard("save the step's tensors"), self.together():
                for name, got in results.items():
                    self.save_fetched(name, state.tensors[name], got)
            if health is not None:
                flags = self.input_flags(run_context.original_args.feed_dict, health)
                if flags:  # (only when the statistics are not all finite)
                    health = np.concatenate([health, np.array([finite for _, finite in flags], health.dtype)])
                self.health_step(health, [(state.health["names"], tuple(w for w, _ in flags))], {}, None)
            state.fetched = []
            state.health_fetched = False
            self.end_step()
        if self.checkpoints is not None:
            # a MonitoredTrainingSession's CheckpointSaverHook runs before the user's hooks: a checkpoint
            # this run call wrote is recorded as of this step now, not at the next call (a job killed
            # between the two would resume from the checkpoint before)
            self.checkpoints.step_boundary()
        if self.should_stop():
            run_context.request_stop()

    def end(self, session):
        if not self.closed:
            self.flush()  # a Trial reads the run; it stays open for a later session

    def close(self) -> None:
        if not self.closed and self.graph_state.graph is None:
            self.warn_once(
                "no session",
                "smdebug: the SessionHook of %s saw no session: give it to a MonitoredSession or "
                "MonitoredTrainingSession (hooks=[hook]); a plain tf.compat.v1.Session runs no SessionRunHook",
                self.out_dir,
            )
        super().close()

    # -- the graph's tensors ---------------------------------------------------------------------------
    def find_tensors(self, graph) -> None:
        """Name the graph's tensors of every included collection, and add the ops fetching them."""
        state = self.graph_state
        found: dict = {}  # name -> tensor
        records = tfgraph.applied(graph)
        before = {k: r for a in records for k, r in a.weights.items()}
        # a graph seen before (a second session): its ops the hook added serve again
        previous = state.tensors if state.graph is graph else {}

        def read_variable(v):
            return previous[v.name].tensor if v.name in previous else tfgraph.read(v)

        with graph.as_default():
            variables = tf.compat.v1.trainable_variables()
            self.include_variables(variables, name_of=lambda v: v.name)
            with tf.compat.v1.name_scope(f"{tfgraph.SCOPE}/weights"):
                for v in variables:
                    found[v.name] = before[v.ref()] if v.ref() in before else read_variable(v)
            for a in records:
                grads = [(name, g) for name, (g, _) in zip(a.names, a.gradients)]
                self.include_names(CollectionKeys.GRADIENTS, [n for n, _ in grads])
                found.update(grads)
                opt = [(v.name, read) for v, read in a.optimizer_variables]
                self.include_names(CollectionKeys.OPTIMIZER_VARIABLES, [n for n, _ in opt])
                found.update(opt)
            losses = tf.compat.v1.losses.get_losses()
            self.include_names(CollectionKeys.LOSSES, [t.name for t in losses])
            found.update((t.name, t) for t in losses)
            found.update(self.summary_tensors(graph))
            with tf.compat.v1.name_scope(f"{tfgraph.SCOPE}/added"):
                for coll in self.get_collections().values():
                    for name, obj in getattr(coll, "graph_objects", {}).items():
                        if name not in found and getattr(obj, "graph", graph) is graph:
                            found[name] = read_variable(obj) if isinstance(obj, tf.Variable) else obj
            variables_found = set(found)  # a read of these is the variable (smdebug 1.0 names it so)
            for op in graph.get_operations():  # what the collections' patterns match (include_regex)
                skip = op.name.startswith(tfgraph.SCOPE + "/") or tfgraph.read_of(op) in variables_found
                if skip:
                    continue
                for t in op.outputs:
                    if t.name not in found and t.dtype not in (tf.resource, tf.variant):
                        if self.collections_of(t.name):
                            found[t.name] = t
            # fetching a tensor a run call may not have (in a TF 1.x tf.cond or tf.while_loop) would make
            # the script's own run call fail: left out, as those TensorFlow marks unfetchable
            unfetchable = tfgraph.unfetchable(graph)
            left_out = [n for n, t in found.items() if t.op in unfetchable and self.collections_of(n)]
            if left_out:
                self.warn_once(
                    "control flow",
                    "smdebug: %d tensors, such as %s, are not saved: a run call cannot always fetch them "
                    "(inside a tf.cond or tf.while_loop of a TF 1.x graph, or marked unfetchable)",
                    len(left_out),
                    ", ".join(left_out[:3]),
                )
            found = {n: t for n, t in found.items() if t.op not in unfetchable}
            tensors = {}
            with tf.compat.v1.name_scope(f"{tfgraph.SCOPE}/reductions"):
                for name, t in found.items():
                    if self.collections_of(name):
                        pairs, old = self.reduction_pairs(name), previous.get(name)
                        reuse = old is not None and old.tensor is t and old.asked == pairs
                        tensors[name] = old if reuse else Fetchable(t, pairs)
            state.tensors = tensors
            if self.health is not None:
                with self.guard("prepare the health statistics"):
                    self.health_tensors(variables, found, records, losses, unfetchable)
        state.graph = graph
        state.reach = tfgraph.Reach(graph)

    def summary_tensors(self, graph) -> list:
        """With tensorflow_summaries included: (name, op output) of the graph's summaries
        (``tf.compat.v1.summary.scalar``, ...), which go to the hook's TensorBoard run as TensorFlow
        serialized them (smdebug 1.0 writes them there only)."""
        if CollectionKeys.TENSORFLOW_SUMMARIES not in self.include_collections:
            return []
        if self.tensorboard_dir is None:
            self.warn_once(
                "summaries",
                "smdebug: the tensorflow_summaries collection is written to TensorBoard only: give the hook "
                "export_tensorboard=True or a tensorboard_dir",
            )
            return []
        summaries = [
            (t.name, t)
            for t in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
            if isinstance(t, tf.Tensor) and t.graph is graph and t.dtype == tf.string
        ]
        self.include_names(CollectionKeys.TENSORFLOW_SUMMARIES, [n for n, _ in summaries])
        self.graph_state.summaries = {n for n, _ in summaries}
        return summaries

    def health_tensors(self, variables, found: dict, records, losses, unfetchable: set) -> None:
        """With health: the ops computing every step's statistics of the trainable variables (before a
        wrapped optimizer's update), their gradients and the graph's first loss (smdebug_tf.health);
        not those a run call may not have (TF 1.x control flow)."""
        from smdebug_tf.health import statistics

        variables = [v for v in variables if v.name in found]
        pairs = [(n, tf.convert_to_tensor(g), v) for a in records for n, (g, v) in zip(a.names, a.gradients)]
        pairs = [(n, g, v) for n, g, v in pairs if g.op not in unfetchable]
        losses = [t for t in losses if t.op not in unfetchable]
        names = [v.name for v in variables] + [name for name, _, _ in pairs] + [t.name for t in losses[:1]]
        weights = [found[v.name] for v in variables]
        grads = [g for _, g, _ in pairs]
        with tf.compat.v1.name_scope(f"{tfgraph.SCOPE}/health"):
            train = statistics(weights + grads + list(losses[:1]), [])
            other = statistics(weights + [None] * len(grads) + list(losses[:1]), [])
        self.graph_state.health = {"train": train, "other": other, "names": tuple(names)}
        health = self.keras_health()

        def scope(v):  # the module of a weight or gradient: its variable's scope (dense/kernel:0 -> dense)
            return v.name.split(":")[0].rsplit("/", 1)[0]

        health.owners = {name: scope(v) for name, _, v in pairs}
        health.owners.update({v.name: scope(v) for v in variables})
        if losses:
            health.loss_name = losses[0].name
            health.owners[losses[0].name] = losses[0].op.name.split("/")[0]

    def health_fetch(self, args):
        """The step's health vector when this run call can compute it (None without health): with the
        gradients in TRAIN and GLOBAL mode."""
        state = self.graph_state
        if state.health is None or self.health is None:
            return None
        training = self.mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL)  # (GLOBAL: a session's default)
        vector = state.health["train" if training else "other"]
        return vector if state.reach.allowed(vector, args.fetches, args.feed_dict) else None

    @staticmethod
    def input_flags(feeds, health) -> list:
        """Only for a step whose statistics are not all finite: ((direction, module, tensor), finite)
        of each floating value the run call fed (the input batch)."""
        if np.isfinite(health).all():
            return []
        flags = []
        for key, value in (feeds or {}).items():
            value = np.asarray(value)
            name = getattr(key, "name", str(key))
            if value.dtype.kind == "f":
                flags.append((("input", name.split(":")[0], name), bool(np.isfinite(value).all())))
        return flags

    def reduction_pairs(self, name: str) -> tuple:
        """Every (reduction, abs) pair any included collection of the tensor may ask for."""
        return tuple(
            dict.fromkeys(
                (reduction, bool(absolute))
                for c in self.collections_of(name)
                if c.name not in self.scalar_collections
                for reduction, absolute in (c.reduction_config or self.reduction_config).reduction_pairs()
            )
        )

    def fetches(self, args) -> dict:
        """``{name: {"raw": tensor, "row": reductions}}`` of the due tensors this run call can fetch."""
        state = self.graph_state
        out = {}
        for name, entry in state.tensors.items():
            plan = self.capture_plan(name)
            if plan is None:
                continue
            if not state.reach.allowed(entry.tensor, args.fetches, args.feed_dict):
                self.warn_once(
                    "unreachable",
                    "smdebug: tensors such as %s are not saved at steps whose run call could not compute them "
                    "(they need a placeholder it does not feed, or a stateful op it does not run)",
                    name,
                )
                continue
            pairs, raw = plan
            in_row = all(p in entry.pairs for p in pairs)
            fetch = {}
            if raw or entry.host or not in_row:
                fetch["raw"] = entry.raw
            if pairs and in_row and entry.vector is not None:
                fetch["row"] = entry.vector
            if fetch:
                out[name] = fetch
        return out

    def save_fetched(self, name: str, entry: Fetchable, got: dict) -> None:
        if name in self.graph_state.summaries:
            self.write_summary(got["raw"])
            return
        host = got.get("raw")
        host = None if host is None else np.asarray(host)
        if entry.host:
            self.save_for_step(name, host)
            return
        row = got.get("row")
        self.save_for_step(name, Captured.of(name, host, row, entry.pairs, entry.sized, entry.empty))

    # -- TensorFlow-specific API -----------------------------------------------------------------------
    def wrap_optimizer(self, optimizer):
        """Return the same ``tf.compat.v1.train.Optimizer``; its gradients, the variables it updates and
        its own variables are now seen by the hook."""
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            self.warn_once(
                "optimizer",
                "smdebug: SessionHook.wrap_optimizer expects a tf.compat.v1.train.Optimizer, got %s; "
                "gradients are not saved",
                type(optimizer).__name__,
            )
            return optimizer
        return tfgraph.wrap_optimizer(optimizer)
