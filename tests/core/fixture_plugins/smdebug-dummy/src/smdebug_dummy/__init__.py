"""A toy framework plugin: values are ``DummyTensor`` objects wrapping a list of numbers."""

from smdebug_dummy.hook import DummyTensor, Hook

__all__ = ["Hook", "DummyTensor"]
