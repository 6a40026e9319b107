"""The PyTorch hook: adapts torch modules, parameters and autograd to smdebug's BaseHook.

Names and steps follow smdebug 1.0:
- a step begins with each forward call of a registered model (its forward pre-hook);
- at that moment the model's parameters are saved as ``<ModelClass>_<parameter name>``;
- gradients are saved as ``gradient/<ModelClass>_<parameter name>`` once autograd has accumulated them
  (at the end of each backward pass through the model's output: those its pass changed);
- every module of the model (the model itself named ``<ModelClass>``, the others by their path in
  ``named_modules()``) and every registered loss (``<LossClass>``) saves its tensors as
  ``<name>_input_<i>`` / ``<name>_output_<i>``, numbered across the calls of one step.

Sharded parameters (DTensor: FSDP2, tensor parallel) keep the same names; every rank captures them and
their gradients (as each rank holds them after backward), whether it writes or not (smdebug_torch.sharded).
In a distributed job each rank's gradients are saved as they are accumulated, before DDP averages them.
"""

from __future__ import annotations

import functools
import logging
import operator
import sys
import weakref
from typing import Any, ClassVar

import torch

from smdebug.plugin import BaseHook, CollectionKeys, HookConfig, SMDebugTypeError, layer_tensor_patterns
from smdebug_torch import sharded, tensors
from smdebug_torch.collection import (
    BUILTIN_PATTERNS,
    GRADIENT_PREFIX,
    INPUT_SUFFIX,
    OUTPUT_SUFFIX,
    Collection,
)

logger = logging.getLogger("smdebug")


def _compiled_parts(module: torch.nn.Module) -> tuple[torch.nn.Module, bool]:
    """For a ``torch.compile``d module: the original module (names belong to it) and whether it was
    compiled with ``fullgraph=True``; for any other module: itself and False."""
    inner = getattr(module, "_orig_mod", None)
    if isinstance(inner, torch.nn.Module) and type(module).__name__ == "OptimizedModule":
        return inner, bool(getattr(getattr(module, "dynamo_ctx", None), "fullgraph", False))
    return module, False


class TorchHookConfig(HookConfig):
    """The PyTorch hook's options: the common ones, and (keyword only) ``gather_full_tensors``: the full
    value of a sharded tensor is gathered and saved whole by the writing ranks, instead of each rank's
    shard (for small models; always so with include_workers="one")."""

    KEYWORD_ONLY: ClassVar[tuple[str, ...]] = (*HookConfig.KEYWORD_ONLY, "gather_full_tensors")
    gather_full_tensors: bool = False


class Hook(BaseHook):
    framework = "pytorch"
    options_class = TorchHookConfig
    collection_class = Collection
    builtin_patterns = BUILTIN_PATTERNS
    default_include_collections = (CollectionKeys.LOSSES,)
    tensor_types = (torch.Tensor,)

    @staticmethod
    def host_view_of(value: Any):
        """The torch plugin's smdebug_host_view, without the plugin call (a loss saved at every step)."""
        return tensors.host_view(value) if isinstance(value, torch.Tensor) else None

    def setup(self) -> None:
        self._module_names: dict[torch.nn.Module, str] = {}  # every hooked module -> its name
        self._models: dict[torch.nn.Module, _Model] = {}
        self._loss_modules: list[torch.nn.Module] = []
        self._handles: list[Any] = []  # the models' step starters: for the hook's lifetime
        self._loss_starters: list[Any] = []  # the losses' step starters, while no model is registered
        # The models' module and gradient callbacks run only in steps that may save something (see _arm).
        self._output_modules: list[torch.nn.Module] = []
        self._wanted: tuple[int, list[torch.nn.Module]] = (-1, [])  # (collections_version, modules)
        self._hooked: list[torch.nn.Module] = []  # the wanted modules when the callbacks were attached
        self._armed_handles: list[Any] = []
        self._armed = False
        self._always_armed = False  # a compiled model: changing its hooks would recompile it
        self._on_output = _Callback(self._on_module_output)
        self._prefixes: dict[torch.nn.Module, tuple[str, str]] = {}  # a hooked module's tensor name prefixes
        self._modules_version = -1
        self._backward_queued = False  # a callback at the end of the running backward pass is queued
        # the running backward pass's models: their gradients when it reached their output
        self._backward: dict[_Model, tuple[list, list, list, list, list]] = {}
        self._incoming: list = []  # the running pass's one-shot hooks on gradients already there
        self._incoming_ids: set[int] = set()  # their parameters' ids
        self._params_watched: set[_Model] = set()  # models whose parameters carry a backward watch
        self._own_watched: set[int] = set()  # ids of the parameters whose own gradient is watched (armed)
        self._health = None  # every step's statistics (health=True): smdebug_torch.health
        if self.health is not None:
            from smdebug_torch.health import TorchHealth

            self._health = TorchHealth(self)
        self._shards = sharded.Shards(self)  # sharded tensors captured, saved at the next flush
        self._grad_hooks: dict[int, Any] = {}  # id(sharded parameter) -> its gradient hook's handle

    # -- distributed training ------------------------------------------------------------------
    def worker_name(self) -> str:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return f"worker_{dist.get_rank()}"
        return super().worker_name()

    def num_workers(self) -> int:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return super().num_workers()

    # -- registration (reference: PyTorch specific Hook API) -----------------------------------
    def register_module(self, module: torch.nn.Module) -> None:
        """Hook the model: each forward call starts a step; parameters, gradients and module tensors
        are saved when their collections are due."""
        if not isinstance(module, torch.nn.Module):
            raise SMDebugTypeError(f"register_module expects a torch.nn.Module, got {type(module).__name__}")
        wrapper = module
        module, fullgraph = _compiled_parts(wrapper)
        if module in self._models or wrapper in self._models:
            logger.warning("smdebug: %s is already registered with this hook", module._get_name())
            return
        model_name = sharded.class_name(module)
        owner = next((m for m in self._models.values() if module in m.modules), None)
        if owner is not None:  # its forward runs inside the owner's: a second step starter
            logger.warning(
                "smdebug: %s is part of %s, already registered with this hook: its tensors are saved as "
                "part of %s, it is not registered again",
                module._get_name(),
                owner.name,
                owner.name,
            )
            return
        inside = set(module.modules())
        for starter, inner in list(self._models.items()):
            if inner.module in inside:
                self._absorb(starter, inner, model_name)
        orig_params = sharded.classic_fsdp(module)
        if orig_params is not None:
            self._warn_classic_fsdp(model_name, flat=not orig_params)
        if fullgraph:
            # No callback can run inside a graph compiled whole: steps start on the compiled wrapper.
            logger.warning(
                "smdebug: %s is compiled with fullgraph=True; weights, gradients and losses are saved, "
                "module inputs/outputs inside the compiled graph are not",
                model_name,
            )
        for path, sub in module.named_modules():
            if sub not in self._module_names:  # a module shared with another registered model keeps its name
                self._module_names[sub] = path or model_name
                if not fullgraph:
                    self._output_modules.append(sub)
                    self._wanted = (-1, [])  # hooked, if wanted, when the model's next forward starts a step
        starter = wrapper if fullgraph else module
        self._models[starter] = _Model(model_name, module)
        self._hook_sharded_grads(self._models[starter])
        _remove(self._loss_starters)
        self._models[starter].handle = starter.register_forward_pre_hook(_Callback(self._on_model_forward))
        self._handles.append(self._models[starter].handle)
        if self._health is not None:
            self._health.watch_model(starter)
        if wrapper is not module:
            self._always_armed = True
        if self._armed:
            self._armed_handles.append(starter.register_forward_hook(self._on_output_of_model))
        hooks = _hooks_of.setdefault(module, weakref.WeakSet())
        other = next((h for h in hooks if not h.closed), None)
        if other is not None:  # e.g. a notebook cell that makes the hook run again
            logger.warning(
                "smdebug: %s is also registered with another hook, still open (out_dir %s): it goes on "
                "saving there too until that hook is closed (hook.close())",
                model_name,
                other.out_dir,
            )
        hooks.add(self)

    def _absorb(self, starter: torch.nn.Module, model: _Model, outer: str) -> None:
        """A registered model is part of the model being registered: its forward runs inside the outer
        one's, so it starts no step of its own and its tensors take their names within the outer model."""
        logger.warning(
            "smdebug: %s, registered with this hook, is part of %s: its steps now start with %s's forward "
            "and its tensors are named as part of %s",
            model.name,
            outer,
            outer,
            outer,
        )
        del self._models[starter]
        model.handle.remove()
        self._handles.remove(model.handle)
        self._prefixes.clear()
        for sub in model.modules:  # named again, within the outer model
            if self._module_names.pop(sub, None) is not None and sub in self._output_modules:
                self._output_modules.remove(sub)
        self._wanted = (-1, [])

    def _warn_classic_fsdp(self, model_name: str, flat: bool) -> None:
        what = (
            "(use_orig_params=False): its parameters are one flat parameter per wrapper; weights and "
            "biases are not saved, the flat parameter's gradient is, as this rank computed it before FSDP "
            "reduces it (gradient/<name>_flat_param)"
            if flat
            else "(use_orig_params=True): its parameters are saved as this rank's views of its flat "
            "parameter (whole when the wrapped model was registered, this rank's part of its flat shard, "
            "flattened, when the wrapper was), their gradients are not saved"
        )
        self.warn_once(
            f"classic_fsdp:{model_name}",
            "smdebug: %s holds a classic FullyShardedDataParallel %s; use torch.distributed.fsdp.fully_shard "
            "(FSDP2) for sharded capture",
            model_name,
            what,
        )

    def register_hook(self, module: torch.nn.Module) -> None:
        """smdebug's older name for register_module."""
        self.register_module(module)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Hook a loss module (e.g. ``nn.CrossEntropyLoss()``): its output is saved in ``losses``."""
        if not isinstance(loss_module, torch.nn.Module):
            raise SMDebugTypeError(
                f"register_loss expects a torch.nn.Module such as nn.CrossEntropyLoss(), "
                f"got {type(loss_module).__name__}"
            )
        if loss_module in self._loss_modules:
            return
        self._loss_modules.append(loss_module)
        if self._health is not None:
            self._health.watch_loss(loss_module)
        if loss_module not in self._module_names:
            self._module_names[loss_module] = loss_module._get_name()
            self._output_modules.append(loss_module)
            self._wanted = (-1, [])
            if self._armed:  # e.g. registered by activation inside its first call, whose output is due
                self._armed_handles.append(loss_module.register_forward_hook(self._on_output))
            if not self._models:
                self._loss_starters.append(
                    loss_module.register_forward_pre_hook(_Callback(self._on_loss_forward))
                )
        self.get_collection(CollectionKeys.LOSSES).add_module_tensors(loss_module)

    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor | None = None) -> None:
        """Save a value computed outside modules (``F.cross_entropy``) as ``<tensor_name>_output_<i>``;
        ``record_tensor_value(loss)``, as smdebug 1.0's PyTorch page writes it, names it "loss"."""
        if tensor_value is None and isinstance(tensor_name, torch.Tensor):
            tensor_name, tensor_value = "loss", tensor_name
        if not isinstance(tensor_value, torch.Tensor):
            raise SMDebugTypeError(
                f"record_tensor_value expects a torch.Tensor, got {type(tensor_value).__name__}"
            )
        if self._health is not None and not self._loss_modules:  # a loss computed without a module
            name = f"{tensor_name}{OUTPUT_SUFFIX}0"
            if self.get_collection(CollectionKeys.LOSSES).matches(name):
                self._health.note_loss(name, tensor_value)
        self.save_numbered(tensor_name + OUTPUT_SUFFIX, tensor_value)

    # -- step boundaries -----------------------------------------------------------------------
    def prepare_collections(self) -> None:
        """Turn modules given to ``add_module_tensors`` into patterns of their tensor names."""
        self._modules_version = Collection.modules_version
        for coll in self.collection_manager.collections.values():
            for module, (inputs, outputs) in getattr(coll, "modules", {}).items():
                name = self._module_names.get(module)
                if name is None:
                    self.warn_once(
                        f"unregistered:{id(module)}",
                        "smdebug: %s was given to add_module_tensors of collection %r but is not part of "
                        "a module registered with register_module/register_loss; its tensors are not saved",
                        module._get_name(),
                        coll.name,
                    )
                    continue
                coll.include(layer_tensor_patterns(name, inputs, outputs))

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """As the core's; a sharded tensor (DTensor) is saved as sharded parameters are: each writing
        rank's shard with its place in the full tensor, and the reductions of the full tensor (every rank
        must call it at the same point: they are combined together)."""
        if not sharded.is_sharded(tensor_value):
            return super().save_tensor(tensor_name, tensor_value, collections_to_write)
        colls = self.save_tensor_collections(tensor_name, collections_to_write)
        if self.closed or not self.in_step:
            self.record_unsaved_tensor(
                tensor_name, "a sharded tensor is saved within a step (once training began)"
            )
            return None
        configs = [c.reduction_config or self.reduction_config for c in colls]
        pairs = dict.fromkeys(pair for config in configs for pair in config.reduction_pairs())
        raw = any(config.save_raw_tensor for config in configs)
        with self.guard("save a sharded tensor"):
            self._shards.save_now(tensor_name, tensor_value.detach(), pairs, raw)
        return None

    def close(self) -> None:
        if self._health is not None and not self.closed:
            self._health.close()  # the last step recorded before the core writes what a trigger asks
        super().close()
        self._arm(False)
        _remove(self._handles)
        _remove(self._loss_starters)
        _remove(list(self._grad_hooks.values()))
        self._grad_hooks.clear()

    def _arm(self, armed: bool) -> None:
        """Attach the models' module and gradient callbacks for a step that may save something, remove
        them for one that cannot: the idle steps of a sparse save configuration then run the model's
        forward pre-hook only, and torch calls the modules without hooks on its fast path."""
        if armed and self._armed:
            wanted = self._modules_wanted()
            if wanted is not self._hooked and wanted != self._hooked:
                self._arm(False)  # collections or modules changed what is wanted: attach again
        if armed == self._armed:
            return
        self._armed = armed
        if armed:
            self._hooked = self._modules_wanted()
            self._armed_handles.extend(m.register_forward_hook(self._on_output) for m in self._hooked)
            self._armed_handles.extend(
                m.register_forward_hook(self._on_output_of_model) for m in self._models
            )
            for model in self._models.values():
                self._watch_own_grads(model)
        else:
            _remove(self._armed_handles)
            self._params_watched.clear()
            self._own_watched.clear()

    def _watch_own_grads(self, model: _Model) -> None:
        """In a distributed job, each rank's gradient as accumulated, before DDP averages it: a hook on
        each parameter not watched yet in this armed stretch (a refreshed model may hold new ones: a lazy
        module's, materialized by the step's forward pass)."""
        if not model.own_grads:
            return
        for name, p in model.gradients:
            if p.requires_grad and p.is_leaf and id(p) not in self._own_watched:
                self._own_watched.add(id(p))
                self._armed_handles.append(
                    p.register_post_accumulate_grad_hook(_Callback(self._on_own_grad, name))
                )

    def _modules_wanted(self) -> list[torch.nn.Module]:
        """The modules an included collection may want the inputs or outputs of (BaseHook.layer_wanted):
        only they get a forward hook on due steps, for a module with hooks costs torch its slow path."""
        version, modules = self._wanted
        if version != self.collections_version:
            modules = [m for m in self._output_modules if self.layer_wanted(self._module_names[m])]
            self._wanted = (self.collections_version, modules)
        return modules

    # -- torch callbacks -----------------------------------------------------------------------
    def _end_step_or_stop(self) -> None:
        """End the previous step (the hook's rules run, the stop signal is looked for) and raise
        StopTraining from this forward call when a rule asked training to stop."""
        self.end_step()
        self.raise_if_stop_requested()

    def _step_starts(self) -> bool:
        """End the last step (StopTraining if a rule asked for it) and begin the next: whether it may
        save something. Between idle steps this costs the least the core offers (next_idle_step)."""
        if self._health is not None:
            self._health.step_ending()
        if Collection.modules_version == self._modules_version and self.next_idle_step():
            _prepare_for_compile()
            return False  # and the callbacks stay as they are
        self._end_step_or_stop()
        self.begin_step()
        # (a rank that does not write still captures sharded tensors: their reductions need every rank)
        return bool(self.due_collections)

    def _on_model_forward(self, module, inputs) -> None:
        if self.closed or (self._health is not None and self._health.rerunning) or not self._step_starts():
            return
        with self.guard("save the parameters"):
            model = self._models[module]
            if model.stale():
                self._refresh(model)
            for name, param in model.sharded:  # on every rank, writing or not: they reduce together
                self._shards.capture(name, param)
            if model.flat_params:  # a classic FSDP wrapped the model after it was registered
                self._warn_classic_fsdp(model.name, flat=True)
            if model.lazy:
                with self.together():  # their reductions computed together at the end of the loop
                    for name, param in model.params:
                        if not _is_uninitialized(param):
                            self.save_for_step(name, param)
            elif model.flat_views:
                self._warn_classic_fsdp(model.name, flat=False)
                if self.any_due(model.names):  # copies: a numpy view would pin FSDP's flat storage
                    held = [(n, p) for n, p in model.params if p.numel()]  # (empty: another rank's part)
                    self.save_many_for_step([n for n, _ in held], [p.detach().clone() for _, p in held])
            elif self.any_due(model.names):
                self.save_many_for_step(model.names, model.values)

    def _refresh(self, model: _Model) -> None:
        """Take the parameters the model has now (like smdebug) and watch the new ones' gradients; by
        whatever notices first that it is stale (a due step's forward pass, health on an idle step)."""
        model.refresh()
        self._hook_sharded_grads(model)
        if self._armed:
            self._watch_own_grads(model)

    def _hook_sharded_grads(self, model: _Model) -> None:
        """A hook on each sharded parameter, called with its gradient shard: by autograd (tensor parallel)
        or by FSDP2 once its reduce-scatter has given the rank its shard."""
        for name, param in model.sharded_grads:
            if id(param) not in self._grad_hooks and param.requires_grad:
                callback = _Callback(self._on_sharded_grad, name)
                self._grad_hooks[id(param)] = param.register_post_accumulate_grad_hook(callback)

    def _on_sharded_grad(self, name: str, param) -> None:
        """Only noted: captured with the step's other sharded tensors at the flush (the gradient is there)."""
        if self.due_collections:  # (empty outside a step)
            self._shards.grads.append((name, param))
            self._queue_flush()

    def _queue_flush(self) -> None:
        """Save the captured sharded tensors at the end of the running backward pass (after FSDP2's own
        end-of-backward work, queued before), where every rank is; else at the step's end."""
        if not self._shards.flush_queued:
            try:
                at_backward_end(self._flush_shards)
                self._shards.flush_queued = True
            except Exception:  # not inside a backward pass: flushed when the step ends
                pass

    def _flush_shards(self) -> None:
        self._shards.flush_queued = False
        with self.guard("save the sharded tensors"):
            self._shards.flush()

    def _on_own_grad(self, name: str, param) -> None:
        """A distributed job's gradient as this rank accumulated it, before DDP's all-reduce (which
        overwrites it in place with gradient_as_bucket_view=True): saved at once."""
        if self.is_due(name) and param.grad is not None and id(param) not in self._incoming_ids:
            with self.guard("save the gradients"):
                self.save_for_step(name, param.grad)

    def _on_loss_forward(self, module, inputs) -> None:
        if not self._models and not self.closed:  # a loss starts the steps only when no model does
            self._step_starts()

    def _on_module_output(self, module, inputs, outputs) -> None:
        if not self.anything_due() or (self._health is not None and self._health.rerunning):
            return
        prefixes = self._prefixes.get(module)
        if prefixes is None:
            name = self._module_names.get(module)
            if name is None:
                return
            prefixes = self._prefixes[module] = (name + INPUT_SUFFIX, name + OUTPUT_SUFFIX)
        self.save_numbered(prefixes[0], inputs)
        self.save_numbered(prefixes[1], outputs)

    def _on_output_of_model(self, module, inputs, outputs) -> None:
        """Watch for the backward passes through the model's output, if its gradients are due: one
        callback per pass, not one per parameter (each costs torch a call into Python)."""
        model = self._models.get(module)
        if model is None or (self._health and self._health.rerunning):
            return
        if model.lazy:  # a lazy module's parameters exist once the first forward has run
            with self.guard("save the parameters"):
                self._refresh(model)
        if not (self.any_due(model.grad_names) or self.any_due(model.sharded_grad_names)):
            return
        with self.guard("watch the gradients"):
            watch = model.watch
            if watch is None:
                watch = model.watch = _Callback(self._on_backward, model)
            watched = False
            # (a model's output is most often one tensor: no walk)
            for tensor in (outputs,) if type(outputs) is torch.Tensor else self.tensors_in(outputs):
                if tensor.requires_grad:
                    watched = True
                    node = tensor.grad_fn
                    if node is not None:  # a pre-hook of the node costs a third of a tensor hook
                        node.register_prehook(watch)
                    else:
                        tensor.register_hook(watch)
            if not watched and torch.is_grad_enabled() and model not in self._params_watched:
                # an output this cannot look into (an object of the script's own class): a backward pass
                # is seen at its first parameter, before that parameter's gradient is accumulated
                self._params_watched.add(model)
                self._armed_handles.extend(
                    p.register_hook(watch) for _, p in model.gradients if p.requires_grad
                )

    def _on_backward(self, model: _Model, _gradient) -> None:
        """A backward pass reached the model's output (or its first parameter), before any gradient of the
        model was accumulated: note them, to save at the pass's end those it changed (a stale gradient is
        not saved, as in smdebug 1.0)."""
        if model in self._backward:
            return  # another of its outputs in the same pass
        if model.sharded:
            self._shards.note_before(model.sharded_grads)
        grads = list(map(_grad_of, model.grad_params))  # (per tensor in C: a model may have hundreds)
        # none yet (zero_grad(set_to_none=True)): whether each is new at the end says all (see _changed)
        versions = hooked = None
        if not all(map(_is_none, grads)):
            versions, hooked = _versions(grads), self._take_incoming(model, grads)
        # (a distributed job's other gradients are saved as accumulated: _on_own_grad)
        self._backward[model] = (model.gradients, model.grad_params, grads, versions, hooked)
        if not self._backward_queued:
            try:
                at_backward_end(self._end_of_backward)
                self._backward_queued = True
            except Exception:  # not a backward pass the engine runs: saved when the step ends
                pass

    def _take_incoming(self, model: _Model, grads: list) -> list[bool] | None:
        """A gradient already there when the pass starts (gradient accumulation, or zeroed in place) is
        saved as the pass computes it, before autograd adds it in: the pass's own contribution, as
        smdebug 1.0 saves it, not the sum so far (a one-shot hook on each due one; which, or None)."""
        hooked = [
            g is not None and p.requires_grad and p.is_leaf and self.is_due(name)
            for (name, p), g in zip(model.gradients, grads)
        ]
        if not any(hooked):
            return None
        for (name, p), on in zip(model.gradients, hooked):
            if on:
                self._incoming.append(p.register_hook(_Callback(self._on_incoming_grad, name)))
                self._incoming_ids.add(id(p))
        return hooked

    def _on_incoming_grad(self, name: str, grad) -> None:
        with self.guard("save the gradients"):
            self.save_for_step(name, grad)

    def _end_of_backward(self) -> None:
        self._backward_queued = False
        passes, self._backward = self._backward, {}
        if self._incoming:
            _remove(self._incoming)
            self._incoming_ids.clear()
        with self.guard("save the gradients"):
            found = [self._changed(model, *noted) for model, noted in passes.items() if not model.own_grads]
            if all(whole for whole, _, _ in found):  # the common case: no block to gather the rest in
                for _, names, grads in found:
                    self.save_many_for_step(names, grads)  # planned once
                return
            with self.together():
                for whole, names, grads in found:
                    if whole:
                        self.save_many_for_step(names, grads)
                        continue
                    for name, grad in zip(names, grads):
                        if grad is not None:
                            self.save_for_step(name, grad)

    @staticmethod
    def _changed(
        model: _Model, gradients: list, params: list, before: list, versions: list | None, hooked: list | None
    ) -> tuple:
        """(whether the pass changed each of the model's planned gradients, their names and gradients),
        else (False, the names and gradients it changed, None for the others). ``versions`` is None when
        no gradient was there before the pass: each changed if and only if it is there now. Those
        ``hooked`` were saved as the pass computed them."""
        grads = list(map(_grad_of, params))
        # changed: a new gradient tensor, or the same one written since (zero_grad(set_to_none=False))
        changed = list(map(operator.is_not, grads, before))
        if versions is not None and not all(changed):
            changed = list(map(operator.or_, changed, map(operator.ne, _versions(grads), versions)))
        if hooked is not None:
            changed = [new and not done for new, done in zip(changed, hooked)]
        if gradients is model.gradients and all(changed) and not any(map(_is_none, grads)):
            return True, model.grad_names, grads
        return False, [name for name, _ in gradients], [g if new else None for g, new in zip(grads, changed)]

    def end_step(self) -> None:
        if self._health is not None:
            self._health.step_ending()
        if self._backward:  # a backward pass that raised (or not run by the engine) never ran its callback
            self._end_of_backward()
        if self.in_step and (self._shards.pending or self._shards.grads):
            with self.guard("save the sharded tensors"):
                self._shards.flush()  # e.g. the weights of a step without backward
        if self._shards.in_flight is not None:
            with self.guard("save the sharded tensors"):
                self._shards.resolve()  # the step's reductions, gathered since its backward pass
        if self._shards.before:
            self._shards.before.clear()  # (a pass that gave no sharded gradient: nothing to subtract from)
        super().end_step()

    def begin_step(self, step: int | None = None, mode_step: int | None = None) -> None:
        self._backward_queued = False
        if Collection.modules_version != self._modules_version:
            self.collections_changed()  # a module was given to add_module_tensors since the last step
        _prepare_for_compile()
        super().begin_step(step, mode_step)
        if not self.closed:
            self._arm(self._always_armed or self.anything_due())


class _Model:
    """A registered model: its name and its parameters' tensor names (``Net_conv1.weight``)."""

    def __init__(self, name: str, module: torch.nn.Module):
        self.name = name
        self.module = module
        self.modules = set(module.modules())  # (as registered: another model registered later may hold it)
        self.handle: Any = None  # its step starter (the forward pre-hook)
        self.watch: Any = None  # the hook's callback at a backward pass through its output (made once)
        self.params: list[tuple[str, torch.nn.Parameter]] = []
        self.names: tuple[str, ...] = ()
        self.gradients: list[tuple[str, torch.nn.Parameter]] = []  # (gradient's name, parameter)
        self.grad_names: tuple[str, ...] = ()
        self.sharded: list[tuple[str, torch.nn.Parameter]] = []  # DTensor parameters (FSDP2, tensor parallel)
        self.sharded_grads: list[tuple[str, torch.nn.Parameter]] = []
        self.sharded_grad_names: tuple[str, ...] = ()
        self.refresh()

    def refresh(self) -> None:
        _watch_parameters()
        # fully_shard swaps the parameters unseen by torch's watch (of a submodule too: sharded_modules)
        self.seen = (_registered[0], sharded.sharded_modules())
        named = [(f"{self.name}_{path}", p) for path, p in sharded.named_parameters(self.module)]
        self.sharded = [(name, p) for name, p in named if sharded.is_sharded(p)]
        self.sharded_grads = [(GRADIENT_PREFIX + name, p) for name, p in self.sharded]
        self.sharded_grad_names = tuple(name for name, _ in self.sharded_grads)
        self.params = [(name, p) for name, p in named if not sharded.is_sharded(p)]
        self.names = tuple(name for name, _ in self.params)
        self.values = [p for _, p in self.params]
        self.gradients = [(GRADIENT_PREFIX + name, p) for name, p in self.params if not _is_uninitialized(p)]
        self.grad_params = [p for _, p in self.gradients]
        self.grad_names = tuple(name for name, _ in self.gradients)
        self.lazy = any(_is_uninitialized(p) for _, p in self.params)
        # views of a classic FSDP's flat parameter (use_orig_params=True): no gradient hook takes them
        # (leaves when the wrapper is registered: FSDP sets their data to views of its flat shard)
        self.flat_views = any(not p.is_leaf for p in self.values) or sharded.classic_fsdp(self.module) is True
        self.flat_params = any(map(sharded.is_flat_parameter, self.values))  # (use_orig_params=False)
        dist = torch.distributed
        # in a distributed job (DDP) each rank's gradient is saved as accumulated, before the all-reduce
        self.own_grads = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def stale(self) -> bool:
        """Whether the model may hold other parameters than at the last refresh: a parameter or a module
        was registered since, in any module (walking a large model's parameters at every step costs more
        than the step's other hook work), a module was given to fully_shard, or a lazy one was not yet
        initialised."""
        return self.lazy or self.seen != (_registered[0], sharded.sharded_modules())


_registered = [0]  # parameters and submodules registered in any module since the watch began
# the hooks each model was registered with (an open one goes on saving when another hook registers it)
_hooks_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _count_registration(module, name, value) -> None:
    _registered[0] += 1


def _watch_parameters() -> None:
    if not _registered[0]:
        _registered[0] = 1
        torch.nn.modules.module.register_module_parameter_registration_hook(_count_registration)
        torch.nn.modules.module.register_module_module_registration_hook(_count_registration)


_grad_of = operator.attrgetter("grad")
_is_none = functools.partial(operator.is_, None)


def _versions(grads: list) -> list[int]:
    """Each gradient's version counter (-1 for none)."""
    if any(map(_is_none, grads)):
        return [-1 if g is None else g._version for g in grads]
    return list(map(operator.attrgetter("_version"), grads))


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()
    handles.clear()


def _is_uninitialized(param) -> bool:
    """A parameter of a lazy module (nn.LazyLinear...) before its first forward pass."""
    return isinstance(param, torch.nn.parameter.UninitializedParameter)


def _compiler_api():
    compiler = getattr(torch, "compiler", None)  # torch >= 2.1; torch._dynamo before
    return getattr(compiler, "is_compiling", None) or torch._dynamo.is_compiling


_is_compiling = _compiler_api()
_eager: list = []  # the callback runner torch.compile leaves alone, once torch._dynamo is imported


def _run(callback, args):
    return callback._fn(*callback._args, *args)


def _prepare_for_compile() -> None:
    """Make the runner that dynamo does not trace (it breaks the graph around it and runs it eagerly).
    Importing torch._dynamo costs about a second, so this waits until the script has imported it
    (torch.compile does): called when callbacks are made and at each step start."""
    if not _eager and "torch._dynamo" in sys.modules:
        compiler = getattr(torch, "compiler", None)
        disable = getattr(compiler, "disable", None) or torch._dynamo.disable
        _eager.append(disable(_run))


def at_backward_end(fn) -> None:
    """Have torch's engine call ``fn`` when the running backward pass ends (RuntimeError outside one),
    eagerly: a backward pass run inside a torch.compile'd function (a whole training step) calls it
    there, and dynamo would compile it as a frame of its own."""
    _prepare_for_compile()
    if _eager:
        fn = functools.partial(_eager[0], _Callback(fn), ())
    torch.autograd.Variable._execution_engine.queue_callback(fn)


def _whole_graph() -> bool:
    """Whether dynamo is tracing a graph compiled whole (fullgraph=True, error_on_graph_break), where a
    callback cannot break the graph to run eagerly: it is then left out of the graph, with one warning.
    Dynamo runs this while tracing and keeps its result as a constant of the graph."""
    global _warned_whole_graph
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        whole = bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))
    except Exception:  # another torch: break the graph as usual
        return False
    if whole and not _warned_whole_graph:
        _warned_whole_graph = True
        logger.warning(
            "smdebug: a registered module runs inside a graph compiled with fullgraph=True, where the "
            "hook's callbacks cannot run: nothing of it is saved; register the compiled module instead "
            "(hook.register_module(torch.compile(model, fullgraph=True))), not a model compiled after "
            "it was registered or compiled in place (model.compile(fullgraph=True))"
        )
    return whole


# What torch.compiler.assume_constant_result(_whole_graph) sets, without importing torch._dynamo (a second)
_whole_graph._dynamo_marked_constant = True  # type: ignore[attr-defined]
_warned_whole_graph = False  # the warning above: once per process


def _inert_callback():
    return _inert


def _inert(*args) -> None:
    return None


class _Callback:
    """What the hook registers with torch.

    torch.compile does not trace it (it runs eagerly between compiled graphs), and a copy or a pickle
    of a registered model (``copy.deepcopy`` for an EMA model, ``torch.save(model)``) carries an inert
    callback instead of a copy of the hook.
    """

    __slots__ = ("_fn", "_args")

    def __init__(self, fn, *args):
        self._fn = fn
        self._args = args
        _prepare_for_compile()

    def __call__(self, *args):
        # only while dynamo traces (it is imported then): eager calls stay cheap
        if (_eager or "torch._dynamo" in sys.modules) and _is_compiling():
            if _whole_graph():  # no graph break possible: nothing of the callback runs
                return None
            _prepare_for_compile()  # traced before any eager call made the runner: this breaks the graph
            return _eager[0](self, args)
        return self._fn(*self._args, *args)

    def __reduce__(self):
        return (_inert_callback, ())
