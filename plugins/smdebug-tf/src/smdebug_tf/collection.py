"""TensorFlow collections: Keras layers and TF variables given by object, and the built-in patterns."""

from __future__ import annotations

import logging
import re

from smdebug.plugin import Collection as BaseCollection
from smdebug.plugin import CollectionKeys

logger = logging.getLogger("smdebug")

# Names that tell their collection by their form. Weights, biases, optimizer variables and metrics have
# free-form names (Keras variable paths, metric names): the hook adds exact patterns for them once it
# sees the model (KerasHook.register_model).
BUILTIN_PATTERNS = {
    CollectionKeys.GRADIENTS: "^gradients/",
    CollectionKeys.LOSSES: "^(val_)?loss$|^(?!gradients/).*_loss$",
    CollectionKeys.OUTPUTS: "^(predictions|labels)(_\\d+)?$",
    CollectionKeys.INPUTS: "^model_input(_\\d+)?$",
}


def exact(name: str) -> str:
    """A pattern matching exactly this tensor name."""
    return f"^{re.escape(name)}$"


def numbered(name: str) -> str:
    """A pattern matching this tensor name, and the names of its parts when it is several tensors
    (``cat/inputs_0``, ``cat/inputs_1``: the list a Concatenate layer takes)."""
    return f"^{re.escape(name)}(_\\d+)?$"


class Collection(BaseCollection):
    """A Collection that also takes Keras layers and TF variables (smdebug 1.0's TF collection API)."""

    def add_keras_layer(self, layer, inputs: bool = False, outputs: bool = True) -> None:
        """Save this Keras layer's input and/or output tensors in the collection (outputs by default)."""
        name = getattr(layer, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"add_keras_layer expects a Keras layer, got {type(layer).__name__}")
        if inputs:
            self.include(numbered(f"{name}/inputs"))
        if outputs:
            self.include(numbered(f"{name}/outputs"))

    def add(self, arg) -> None:
        """Add a tf.Variable / keras.Variable (by its path), a named graph tensor, or a list or set of them;
        in a TF 1.x graph (``tf.compat.v1``), a tf.Tensor, tf.Variable or tf.Operation (its outputs), by
        its graph name (``dense/kernel:0``), for a SessionHook to fetch."""
        if isinstance(arg, (list, tuple, set)):
            for item in arg:
                self.add(item)
            return
        from smdebug_tf.capture import variable_name
        from smdebug_tf.graph import graph_tensors

        found = graph_tensors(arg)
        if found is not None:
            objects = self.__dict__.setdefault("graph_objects", {})
            for name, obj in found:
                objects[name] = obj
                self.include(exact(name))
            return

        path = getattr(arg, "path", None)
        name = path if isinstance(path, str) else None
        if name is None:
            try:
                name = arg.name  # a graph tensor or tf.Variable; an eager tensor has no meaningful name
            except (AttributeError, ValueError):
                name = None
        if not isinstance(name, str) or not name:
            logger.warning(
                "smdebug: collection %r cannot add a %s: it takes tf.Variable, keras.Variable or named "
                "tensors (save an eager tensor with hook.save_tensor)",
                self.name,
                type(arg).__name__,
            )
            return
        self.include(exact(variable_name(arg)))

    def add_for_mode(self, arg, mode=None) -> None:
        """smdebug 1.0's spelling of ``add`` (the mode is not needed: names are saved in every mode)."""
        self.add(arg)
