"""MXNet collections: a block's input/output tensors by block, and the built-in collections' patterns."""

from __future__ import annotations

from smdebug.plugin import INPUT_SUFFIX, OUTPUT_SUFFIX, CollectionKeys, layer_tensor_patterns  # noqa: F401
from smdebug.plugin import Collection as BaseCollection

GRADIENT_PREFIX = "gradient/"

# The patterns smdebug 1.0 gives the built-in MXNet collections (searched anywhere in a name): Gluon names
# parameters <prefix>weight / <prefix>bias and a loss block's outputs <lossname>N_output_<i>.
BUILTIN_PATTERNS = {
    CollectionKeys.WEIGHTS: "^(?!gradient).*weight",
    CollectionKeys.BIASES: "^(?!gradient).*bias",
    CollectionKeys.GRADIENTS: "^gradient",
    CollectionKeys.LOSSES: ".*loss._(?!input).*output",
}


class Collection(BaseCollection):
    """A Collection that can also name Gluon blocks whose inputs/outputs it saves."""

    def add_block_tensors(self, block, inputs: bool = False, outputs: bool = True) -> None:
        """Save this block's input and/or output tensors as part of the collection (outputs by default).
        A Gluon block's name is fixed when it is created, so this is a pattern on its tensor names."""
        name = getattr(block, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"add_block_tensors expects a Gluon block, got {type(block).__name__}")
        self.include(layer_tensor_patterns(name, inputs, outputs))
