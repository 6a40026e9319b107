"""Run by both libraries on one run: a custom rule as the docs write it, through invoke_rule with the
documented arguments; prints, per call, the steps invoke_at_step saw and how invoke_rule ended (JSON)."""

import json
import sys

from smdebug.exceptions import NoMoreData, RuleEvaluationConditionMet
from smdebug.rules import Rule, invoke_rule
from smdebug.trials import create_trial


class CustomGradientRule(Rule):
    def __init__(self, base_trial, threshold="10.0"):
        super().__init__(base_trial, "")  # smdebug 1.0.34 requires action_str
        self.threshold = float(threshold)
        self.seen = []

    def invoke_at_step(self, step):
        self.seen.append(step)
        for tname in self.base_trial.tensor_names(collection="gradients"):
            abs_mean = self.base_trial.tensor(tname).reduction_value(step, "mean", abs=True)
            if abs_mean > self.threshold:
                return True
        return False


class NeedsEarlierStep(Rule):
    """Declares, at each step, a gradient at that step and ``back`` steps earlier (req_tensors)."""

    def __init__(self, base_trial, name, regex="False", back="1"):
        super().__init__(base_trial, "")
        self.name, self.regex, self.back = name, regex == "True", int(back)
        self.seen = []

    def set_required_tensors(self, step):
        self.req_tensors.add(self.name, steps=[step - self.back, step], should_match_regex=self.regex)

    def invoke_at_step(self, step):
        names = sorted(t.name for t in self.req_tensors.get())
        self.seen.append([step, [[n, self.req_tensors.get_tensor_steps(n)] for n in names]])
        return False


def required(path):
    """Which steps a rule declaring required tensors is evaluated at, and with which tensors."""
    gradient = sorted(create_trial(path).tensor_names(collection="gradients"))[0]
    out = []
    for args in [
        (gradient,),
        ("gradient/.*", "True"),
        ("nope",),
        (gradient, "False", "2"),
        ("nothing.*", "True"),
    ]:
        rule = NeedsEarlierStep(create_trial(path), *args)
        try:
            invoke_rule(rule)
            ended = "returned"
        except NoMoreData:
            ended = "NoMoreData"
        out.append([list(args), rule.seen, ended])
    return out


def outcome(path, threshold, **kwargs):
    rule = CustomGradientRule(create_trial(path), threshold=threshold)
    try:
        invoke_rule(rule, **kwargs)
        ended = {"ended": "returned"}
    except RuleEvaluationConditionMet as met:
        ended = {
            "ended": "RuleEvaluationConditionMet",
            "rule": met.rule_name,
            "step": met.step,
            "str": str(met),
        }
    except NoMoreData as end:
        ended = {"ended": "NoMoreData", "step": end.step, "last_step": end.last_step, "str": str(end)}
    return {"seen": rule.seen, **ended}


CALLS = [
    {},
    {"raise_eval_cond": True},
    {"start_step": 3},
    {"start_step": 3, "raise_eval_cond": True},
    {"start_step": 0, "end_step": 5},
    {"start_step": 0, "end_step": 5, "raise_eval_cond": True},
    {"start_step": 2, "end_step": 3, "raise_eval_cond": True},
    {"end_step": 100},
    {"start_step": 50},
    {"start_step": None, "end_step": None, "raise_eval_cond": False},
]

if __name__ == "__main__":
    path, threshold = sys.argv[1], sys.argv[2]
    if threshold == "required":
        print(json.dumps(required(path)))
    else:
        print(json.dumps([outcome(path, threshold, **kwargs) for kwargs in CALLS]))
