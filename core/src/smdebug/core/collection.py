"""``smdebug.core.collection``: the same Collection and CollectionKeys as ``smdebug``."""

from smdebug.collection import Collection, CollectionKeys

__all__ = ["Collection", "CollectionKeys"]
