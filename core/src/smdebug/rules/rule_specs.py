"""The rules a sweep evaluates (smdebug.rules.sweep): each given rule, as a name, a rule_configs entry or a
Rule class with its parameters, becomes a RuleSpec that builds the rule on any worker; whether its steps
can be evaluated in ranges of their own, and whether it compares runs."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from smdebug.exceptions import SMDebugValueError

# Built-in rules whose verdict at a step reads only what the runs saved (no state kept between steps):
# any range of their steps can be evaluated on its own.
STEP_INDEPENDENT = frozenset(
    {
        "vanishing_gradient",
        "exploding_tensor",
        "all_zero",
        "unchanged_tensor",
        "tensor_variance",
        "similar_across_runs",
        "weight_update_ratio",
        "dead_relu",
        "saturated_activation",
        "confusion",
        "nlp_sequence_ratio",
    }
)
_COMPARE_PARAMS = ("other_trials", "other_trial")


@dataclass(frozen=True)
class RuleSpec:
    """One rule to evaluate on every run: a built-in rule's name or configuration, or a Rule class."""

    target: object  # a name (str), a rule_configs dict, or a Rule subclass
    params: tuple = ()  # (key, value) pairs
    label: str = ""
    step_independent: bool = False
    compares: bool = False  # takes other_trial(s) and none was given: compared with the baseline runs
    # the baseline run is judged too, without other trials: a custom rule, whose other_trials the
    # walkthrough calls optional (only a built-in comparison, similar_across_runs, needs them)
    baseline_too: bool = False
    optional: bool = False  # from the default set: skipped (not an error) when it needs parameters

    def build(self, trial, other_trials=()):
        from smdebug.rules.builtin import construct, create_rule

        params = dict(self.params)
        others = list(other_trials) if self.compares else None
        if isinstance(self.target, type):
            return construct(self.target, trial, params, others)
        return create_rule(self.target, trial, other_trials=others, **params)


def _parameters(cls) -> set[str]:
    return set(list(inspect.signature(cls.__init__).parameters)[2:])


def rule_specs(rules=None, *, with_comparisons: bool = True) -> list[RuleSpec]:
    """RuleSpecs from names (``"vanishing_gradient"``), ``rule_configs`` entries, Rule classes, or pairs
    of one of those and its parameters (``("loss_not_decreasing", {"num_steps": 5})``). None: every
    built-in rule (those needing parameters are then skipped)."""
    from smdebug.rules.base import BuiltinRule
    from smdebug.rules.builtin import CUSTOM_RULE_MODULE, builtin_rules, find_rule
    from smdebug.rules.rule import Rule

    optional = rules is None
    if rules is None:
        found = builtin_rules().items()
        rules = [n for n, cls in found if with_comparisons or not _parameters(cls) & set(_COMPARE_PARAMS)]
    elif isinstance(rules, (str, dict, type)):
        rules = [rules]
    specs = []
    for item in rules:
        params: dict = {}
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], dict):
                raise SMDebugValueError(f"rule {item!r}: expected (rule, {{parameter: value}})")
            item, params = item
        if isinstance(item, type):
            if not issubclass(item, Rule):
                raise SMDebugValueError(f"{item.__name__} is not a Rule subclass")
            cls, label = item, getattr(item, "name", "") or item.__name__
        elif isinstance(item, dict):
            section = item.get("DebugRuleConfiguration", item)
            given = section.get("RuleParameters") or {}
            cls = find_rule(given.get("rule_to_invoke") or section.get("RuleConfigurationName"))
            label = getattr(cls, "name", "") or cls.__name__
            params = {**{k: v for k, v in given.items() if k != "rule_to_invoke"}, **params}
        elif isinstance(item, str):
            cls = find_rule(item)
            label = getattr(cls, "name", "") or cls.__name__
        else:
            raise SMDebugValueError(f"{item!r} is not a rule (a name, a rule_configs entry or a Rule class)")
        target = item if isinstance(item, type) else label if not isinstance(item, dict) else item
        if isinstance(item, str) and cls.__module__.startswith(CUSTOM_RULE_MODULE):
            target = item.strip()  # FILE.py:CLASS: each worker imports the file itself
        independent = getattr(cls, "step_independent", None)
        if independent is None:
            independent = getattr(cls, "name", None) in STEP_INDEPENDENT and cls.__module__.startswith(
                "smdebug."
            )
        compares = bool(_parameters(cls) & set(_COMPARE_PARAMS)) and not (set(params) & set(_COMPARE_PARAMS))
        specs.append(
            RuleSpec(
                target=target,
                params=tuple(sorted(params.items())),
                label=label,
                step_independent=bool(independent),
                compares=compares,
                baseline_too=compares and not issubclass(cls, BuiltinRule),
                optional=optional,
            )
        )
    return specs
