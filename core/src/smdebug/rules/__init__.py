"""Rules: conditions checked step by step on saved runs.

- ``Rule`` (subclass it, implement ``invoke_at_step``) and ``invoke_rule`` (run one over a trial);
- the built-in rules (``VanishingGradient``, ``LossNotDecreasing``, ...), ``builtin_rules()`` (by
  configuration name, plugins' rules included) and ``create_rule(name, base_trial, **params)``;
- ``rule_configs.<name>()``: each built-in rule's default configuration.
"""

from smdebug.rules import rule_configs
from smdebug.rules.builtin import builtin_rules, create_rule
from smdebug.rules.generic import *  # noqa: F403 (the built-in rule classes)
from smdebug.rules.generic import __all__ as _builtin_classes
from smdebug.rules.rule import Rule
from smdebug.rules.rule_invoker import invoke_rule

__all__ = ["Rule", "invoke_rule", "builtin_rules", "create_rule", "rule_configs", *_builtin_classes]
