"""``smdebug rules RUN [RUN ...] [--rule NAME [--param K=V ...]]... [--watch]``: run built-in rules over
one run or many.

Without ``--rule`` every built-in rule that needs no parameter runs. A progress bar follows the work (on
stderr), then a table gives each rule's result (on stdout). A rule that had nothing to
check (no step, no tensor it reads) shows "no data", not "ok". Exit code: 1 when a rule fired, 0 when none
did, 2 on an error. With ``--watch`` the command follows a live run until it ends and, the first time a
rule fires, leaves the stop signal in the run's folder: the running hook then stops training at its next
step (see ``smdebug.rules.actions``).

Several runs (paths, globs, a folder or s3:// prefix holding runs) are evaluated as (rule, run, step range)
tasks on a Dask LocalCluster (``--workers N``, default: the machine's cores) or an existing cluster
(``--scheduler ADDRESS``); without Dask installed, in this process. A run still being written is followed
until it ends (or no new step comes for ``--timeout`` seconds, 60 unless ``--watch``). ``--json`` prints
the results for machines. See ``smdebug.rules.sweep``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from smdebug.cli._common import EXIT_ERROR, EXIT_FIRED, rules_progress, steps_text
from smdebug.exceptions import (
    NoMoreData,
    RuleEvaluationConditionMet,
    SMDebugError,
    SMDebugValueError,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.store import StoreUnavailableError

_SKIPPABLE = (TensorUnavailableForStep, TensorUnavailable, StepUnavailable, StepNotYetAvailable)


class _RuleArgs(argparse.Action):
    """--rule NAME starts a rule; each --param K=V after it is one of that rule's parameters."""

    def __call__(self, parser, namespace, values, option_string=None):
        rules = getattr(namespace, "rules", None) or []
        if option_string == "--rule":
            rules.append((values, {}))
        else:
            key, sep, value = values.partition("=")
            if not sep or not key.strip():
                parser.error(f"--param {values!r}: expected KEY=VALUE, e.g. --param threshold=1e-7")
            if not rules:
                parser.error(f"--param {values}: give --rule NAME before its parameters")
            rules[-1][1][key.strip()] = value
        namespace.rules = rules


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "rules",
        help="run built-in rules over a run (exit code 1 when one fires)",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "runs",
        metavar="RUN",
        nargs="+",
        help="a run's folder or URI (local, s3://, any fsspec path), a glob, or a folder holding runs",
    )
    parser.add_argument(
        "--rule",
        action=_RuleArgs,
        dest="rules",
        metavar="NAME",
        help="a rule to run (repeatable): a built-in rule's name, or FILE.py:CLASS for a custom rule",
    )
    parser.add_argument(
        "--param", action=_RuleArgs, dest="rules", metavar="K=V", help="a parameter of the preceding --rule"
    )
    parser.add_argument(
        "--watch", action="store_true", help="follow a live run; stop training when a rule fires"
    )
    parser.add_argument("--start-step", type=int, default=0, help="first step to evaluate")
    parser.add_argument("--end-step", type=int, default=None, help="evaluate steps before this one")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="with --watch (or a live run among several): give up after this many seconds without a new step",
    )
    many = parser.add_argument_group("many runs (Dask)")
    many.add_argument(
        "--workers", type=_positive, default=None, help="LocalCluster worker processes (default: cores)"
    )
    many.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask cluster, e.g. tcp://host:8786")
    many.add_argument("--json", action="store_true", help="print the results as JSON")
    many.add_argument("--all", action="store_true", help="list every (run, rule), not only those that fired")
    many.add_argument(
        "--baseline", metavar="RUN", help="the run others are compared with (default: the first)"
    )
    many.add_argument(
        "--steps-per-task", type=_positive, default=None, help="steps of one task (default 250)"
    )
    parser.set_defaults(func=run, rules=None)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


@dataclass
class _State:
    name: str
    rule: object = None
    fired: list = field(default_factory=list)
    reason: str = ""
    error: str = ""
    skipped: str = ""
    nodata: str = ""  # why the rule judged nothing (no step, no tensor it reads): not "ok"


def run(args) -> int:
    if args.end_step is not None and args.end_step <= args.start_step:
        raise SMDebugValueError(
            f"--end-step {args.end_step} leaves no step to evaluate (--start-step {args.start_step})"
        )
    if _many(args):
        from smdebug.cli.sweep import run_many

        return run_many(args)
    args.out = args.runs[0]
    return _run_one(args)


def _many(args) -> bool:
    """Whether to take the many-runs path: several RUNs, a glob, a folder holding runs, or its options."""
    if len(args.runs) > 1 or args.json or args.workers or args.scheduler or args.baseline:
        return True
    path = args.runs[0]
    pattern = any(c in path for c in "*?[")
    from smdebug import plugins
    from smdebug.cli._common import REACH_TIMEOUT
    from smdebug.layout import WRITERS_DIR, is_run

    answer: list[tuple[bool, bool]] = []

    def look() -> None:  # a folder (or prefix) that exists and is not itself a run holds runs
        try:
            store = plugins.open_store(path)
            isdir = os.path.isdir(store.root) if store.is_local else store.ask(store.fs.isdir, store.root)
            # a writer's claim and nothing else yet: a run starting (--watch waits for its first step)
            starting = store.ask(store.fs.exists, f"{store.root}/{WRITERS_DIR}")
            answer.append((isdir, bool(isdir and (starting or is_run(store)))))
        except Exception:
            answer.append((False, False))  # _run_one reports it

    os.environ.setdefault("AWS_MAX_ATTEMPTS", "2")  # a command, not training: fail soon (as reach_trial)
    thread = threading.Thread(target=look, name="smdebug-cli-look", daemon=True)
    thread.start()
    thread.join(REACH_TIMEOUT)
    if answer and answer[0][1]:
        return False  # a run, even one whose name holds glob characters (``exp[1]/run``)
    if pattern:
        return True  # a glob of runs
    if not answer:
        from smdebug.store import redact

        raise SMDebugValueError(f"{redact(path)}: cannot read the run: no answer within {REACH_TIMEOUT:g} s")
    return answer[0][0]  # False on an error, which _run_one reports


def _run_one(args) -> int:
    from smdebug.cli._common import reach_trial
    from smdebug.rules.rule import nothing_checked
    from smdebug.rules.stalled import StalledTrainingRule

    trial = _open(args.out, args.watch, args.timeout, lambda path: reach_trial(path, missing_ok=args.watch))
    states = rule_states(trial, args.rules)
    active = [s for s in states if s.rule is not None]
    # A rule that watches for stalls waits with a time limit: it goes first so that the others, which
    # wait for the step without one, never keep it from firing.
    active.sort(key=lambda s: not isinstance(s.rule, StalledTrainingRule))

    with rules_progress() as progress:
        if args.watch:
            message = _watch(trial, active, args, progress)
        else:
            message = _evaluate_saved(trial, active, args, progress)
    for state in active:
        unmatched = getattr(state.rule, "unmatched", None)
        if not (state.fired or state.error) and unmatched is not None:
            state.error = unmatched()  # a typo in the tensors to check: not "ok"
        if not (state.fired or state.error):
            state.nodata = nothing_checked(state.rule)
    _print_table(states, trial, message)
    if any(s.fired for s in states):
        return EXIT_FIRED
    # a rule with nothing to check neither fired nor failed: shown as "no data", exit code unchanged
    return EXIT_ERROR if any(s.error for s in states) else 0


def rule_states(trial, rules=None) -> list[_State]:
    """One _State per rule: those given as (name, params), else every built-in rule (those that need
    parameters skipped, saying so). Shared with ``smdebug report``."""
    from smdebug.rules.builtin import builtin_rules, create_rule

    states: list[_State] = []
    if rules:
        for name, params in rules:
            rule = create_rule(name, trial, **params)  # a bad name or parameter is an error
            states.append(_State(getattr(rule, "name", "") or name, rule))
    else:
        for name in builtin_rules():
            try:
                states.append(_State(name, create_rule(name, trial)))
            except (SMDebugError, TypeError, ValueError) as exc:
                states.append(_State(name, skipped=f"needs parameters: {exc}"))
    return states


def _open(path: str, watch: bool, timeout: float | None, create_trial):
    trial = create_trial(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    outage = _Outage()
    while True:
        try:
            if trial.steps(show_incomplete_steps=True) or trial.collections():
                return trial
        except StoreUnavailableError as exc:
            if not watch:
                raise
            outage.say(exc)
        if not watch:
            from smdebug.layout import no_run_here

            raise SMDebugValueError(no_run_here(trial.store, path))
        if deadline is not None and time.monotonic() > deadline:
            raise SMDebugValueError(f"{path}: no smdebug run appeared within {timeout:g}s")
        time.sleep(OUTAGE_RETRY if outage.said else 0.2)
        try:
            trial.refresh()
        except StoreUnavailableError as exc:
            outage.say(exc)


# With --watch, a remote store that does not answer (an outage) is asked again this often (seconds).
OUTAGE_RETRY = 1.0


class _Outage:
    """--watch through a store that does not answer: said once on stderr (again after it answered)."""

    def __init__(self):
        self.said = False

    def say(self, exc: BaseException) -> None:
        if not self.said:
            cause = " ".join(str(exc).split())
            print(
                f"smdebug rules: cannot read the run ({cause}); watching on, retrying every {OUTAGE_RETRY:g} s",
                file=sys.stderr,
            )
            self.said = True

    def over(self) -> None:
        self.said = False


def _invoke(state: _State, step: int, on_fire=None) -> None:
    try:
        state.rule.invoke(step)
    except RuleEvaluationConditionMet:
        state.fired.append(step)
        state.reason = state.reason or getattr(state.rule, "reason", "")
        if on_fire is not None:
            on_fire(state, step)
    except _SKIPPABLE:
        pass
    except (NoMoreData, TimeoutError):  # the run ended, or --watch's --timeout passed
        raise
    except StoreUnavailableError:  # the store did not answer: no broken rule (--watch asks again)
        raise
    except Exception as exc:  # one broken rule does not stop the others
        state.error = f"{type(exc).__name__}: {exc}"


def _evaluate_saved(trial, active, args, progress) -> str:
    steps = [
        s for s in trial.steps() if s >= args.start_step and (args.end_step is None or s < args.end_step)
    ]
    task = progress.add_task("steps", total=len(steps))
    evaluate_steps(active, steps, lambda: progress.advance(task))
    if not trial.training_ended():
        return f"the run is still going: evaluated the {len(steps)} steps saved so far (--watch follows it)"
    return ""


def evaluate_steps(active: list[_State], steps: list[int], after_step=None) -> None:
    """Invoke each rule at each saved step, recording where it fired (shared with ``smdebug report``)."""
    for step in steps:
        for state in active:
            if not state.error:
                try:
                    _invoke(state, step)
                except NoMoreData:
                    pass
        if after_step is not None:
            after_step()


def _watch(trial, active, args, progress) -> str:
    from smdebug.rules.actions import write_stop_signal
    from smdebug.rules.stalled import StalledTrainingRule

    signalled: list = []
    pending: list = []  # (state, step) of a stop signal the store did not take yet: written once it does

    def send() -> None:
        state, step = pending[0]
        if trial.training_ended():  # nobody left to stop: no signal to lie in the run
            signalled.append("")
        else:
            try:
                write_stop_signal(trial.store, state.rule.rule_name, step, state.reason)
            except Exception as exc:
                if trial.store.is_local or isinstance(exc, SMDebugError):
                    raise
                raise StoreUnavailableError(
                    f"{trial.store.uri}: the stop signal was not written: {trial.store.describe(exc)}"
                ) from exc
            signalled.append(state.name)
        pending.clear()

    def stop_training(state: _State, step: int) -> None:
        if signalled or pending:
            return
        pending.append((state, step))
        try:
            send()
        except StoreUnavailableError:
            pass  # written at the loop's next turn (which says the outage)

    trial.refresh_interval = 0.2
    for state in active:  # a stall rule waits for each step up to its threshold: --timeout is the limit
        if isinstance(state.rule, StalledTrainingRule):
            state.rule.max_wait = args.timeout
    task = progress.add_task("steps (watching)", total=None)
    step = args.start_step
    done = 0
    outage = _Outage()
    judged: set[int] = set()  # the rules judged at this step: an outage in between does not judge them again
    finished = False  # this step judged by every rule
    while args.end_step is None or step < args.end_step:
        try:
            if pending:
                send()
            if not finished:
                try:
                    _judge(active, step, judged, stop_training, stalled=True)
                    trial.wait_for_steps([step], timeout=args.timeout)
                    _judge(active, step, judged, stop_training, stalled=False)
                    done += 1
                    progress.update(task, completed=done, total=max(done, len(trial.steps())))
                except StepUnavailable:
                    pass  # not saved: a later step exists
                finished = True
            later = [s for s in trial.steps(show_incomplete_steps=True) if s > step]
        except NoMoreData:
            break
        except StoreUnavailableError as exc:  # before TimeoutError: a read given up is one of them
            outage.say(exc)
            time.sleep(OUTAGE_RETRY)
            continue
        except TimeoutError:
            return f"stopped watching: no new step for {args.timeout:g}s"
        outage.over()
        step = later[0] if later else step + 1
        judged.clear()
        finished = False
    if pending:  # the run ended or --end-step came while the store did not take the signal
        send()
    if signalled and signalled[0]:
        return f"stop signal left in {trial.path} when {signalled[0]} fired"
    if signalled:
        return "the run had already ended: no stop signal left"
    return ""


def _judge(active: list[_State], step: int, judged: set[int], on_fire, stalled: bool) -> None:
    """Invoke the stall rules (stalled=True) or the others at step, each once (``judged``)."""
    from smdebug.rules.stalled import StalledTrainingRule

    for state in active:
        if (
            isinstance(state.rule, StalledTrainingRule) == stalled
            and not state.error
            and id(state) not in judged
        ):
            _invoke(state, step, on_fire)
            judged.add(id(state))


def _print_table(states: list[_State], trial, message: str) -> None:
    from rich.console import Console
    from rich.table import Table

    # piped: COLUMNS when set (rich reads it), else wide enough not to fold
    console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
    table = Table(title=f"Rules on {trial.path}", title_justify="left")
    for column in ("Rule", "Result", "Fired at steps", "Details"):
        table.add_column(column, overflow="fold")
    for s in states:
        if s.fired:
            result, details = "[bold red]FIRED[/bold red]", s.reason
        elif s.error:
            result, details = "[yellow]error[/yellow]", s.error
        elif s.skipped:
            result, details = "[dim]skipped[/dim]", s.skipped
        elif s.nodata:
            result, details = "[cyan]no data[/cyan]", s.nodata
        else:
            result, details = "[green]ok[/green]", ""
        table.add_row(s.name, result, steps_text(s.fired), details)
    console.print(table)
    if message:
        console.print(message)
