"""Rules: conditions checked step by step on saved runs (``Rule``, ``invoke_rule``)."""

from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import invoke_rule

__all__ = ["Rule", "invoke_rule"]
