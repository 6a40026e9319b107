"""PyTorch collections: module inputs/outputs by module, and the built-in collections' patterns."""

from __future__ import annotations

from smdebug.plugin import INPUT_SUFFIX, OUTPUT_SUFFIX, CollectionKeys  # noqa: F401 (the plugin's names)
from smdebug.plugin import Collection as BaseCollection

GRADIENT_PREFIX = "gradient/"

# The patterns smdebug 1.0 gives the built-in PyTorch collections (matched anywhere in a name).
BUILTIN_PATTERNS = {
    CollectionKeys.WEIGHTS: "^(?!gradient).*weight",
    CollectionKeys.BIASES: "^(?!gradient).*bias",
    CollectionKeys.GRADIENTS: "^gradient",
    CollectionKeys.LOSSES: "[Ll]oss_(?!input).*output",
}


class Collection(BaseCollection):
    """A Collection that can also hold modules whose inputs/outputs it saves."""

    # Bumped whenever a module is added to any collection, so a hook notices at its next step.
    modules_version = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._modules: dict = {}  # module -> (include inputs, include outputs)

    def add_module_tensors(self, module, inputs: bool = False, outputs: bool = True) -> None:
        """Save this module's input and/or output tensors as part of the collection (outputs by default)."""
        old_inputs, old_outputs = self._modules.get(module, (False, False))
        self._modules[module] = (old_inputs or bool(inputs), old_outputs or bool(outputs))
        Collection.modules_version += 1

    @property
    def modules(self) -> dict:
        return self._modules
