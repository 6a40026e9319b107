"""MXNet collections: a block's input/output tensors by block, and the built-in collections' patterns."""

from __future__ import annotations

import re

from smdebug.plugin import Collection as BaseCollection
from smdebug.plugin import CollectionKeys

GRADIENT_PREFIX = "gradient/"
INPUT_SUFFIX = "_input_"
OUTPUT_SUFFIX = "_output_"

# The patterns smdebug 1.0 gives the built-in MXNet collections (searched anywhere in a name): Gluon names
# parameters <prefix>weight / <prefix>bias and a loss block's outputs <lossname>N_output_<i>.
BUILTIN_PATTERNS = {
    CollectionKeys.WEIGHTS: "^(?!gradient).*weight",
    CollectionKeys.BIASES: "^(?!gradient).*bias",
    CollectionKeys.GRADIENTS: "^gradient",
    CollectionKeys.LOSSES: ".*loss._(?!input).*output",
}


def block_tensor_patterns(block_name: str, inputs: bool, outputs: bool) -> list[str]:
    """The patterns of one block's input and/or output tensors (``dense0_output_0``, ...)."""
    suffixes = ([INPUT_SUFFIX] if inputs else []) + ([OUTPUT_SUFFIX] if outputs else [])
    return [f"^{re.escape(block_name + suffix)}\\d+$" for suffix in suffixes]


class Collection(BaseCollection):
    """A Collection that can also name Gluon blocks whose inputs/outputs it saves."""

    def add_block_tensors(self, block, inputs: bool = False, outputs: bool = True) -> None:
        """Save this block's input and/or output tensors as part of the collection (outputs by default).
        A Gluon block's name is fixed when it is created, so this is a pattern on its tensor names."""
        name = getattr(block, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"add_block_tensors expects a Gluon block, got {type(block).__name__}")
        self.include(block_tensor_patterns(name, inputs, outputs))
