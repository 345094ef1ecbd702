"""What `check` and a starting run say of a config's plan before anything launches: the gangs its runners cannot
run or its slots cannot hold (`gang_problems`), and what would launch where (`describe_plan`). Here rather than
in hardware/: they ask each pipeline's runner, and the device layer asks none."""
from __future__ import annotations

from ..config.problems import Problem, display_path
from ..config.schema import RunConfig
from ..config.validated import TO_VALIDATE, reports_validation
from ..hardware.devices import Inventory
from ..hardware.grants import THIS_RUN, Holdings, Policy, grant, held_lines, leases_for, request_of
from ..hardware.placement import order_pipelines, plan_validation, request_problem, validation_line
from ..hardware.slots import Slot
from ..protocol.names import ValidationMode
from ..runners.registry import runner_for


def gang_problems(config: RunConfig, slots: list[Slot]) -> list[Problem]:
    """Requests that could never be granted here (more ranks or GPUs than the machine has, a share larger
    than any GPU; on a cluster a gang spans nodes when no one node has room for it), runners that cannot run
    as gangs, and strategies the slots cannot run."""
    problems = []
    for i, p in enumerate(config.pipelines):
        problem = request_problem(p, slots, config.devices)
        if problem is not None:
            problems.append(Problem(display_path(config.source), f"pipelines[{i}].{problem[0]}", problem[1]))
        elif p.max_ranks > 1 and runner_for(p.kind).gang_problem:
            problems.append(Problem(display_path(config.source), f"pipelines[{i}].ranks",
                                    runner_for(p.kind).gang_problem))
        elif p.elastic and (why := runner_for(p.kind).elastic_problem(p)):
            problems.append(Problem(display_path(config.source), f"pipelines[{i}].ranks", why))
        elif p.max_ranks > 1 and (why := runner_for(p.kind).strategy_problem(p, any(s.device == "cuda"
                                                                                     for s in slots))):
            problems.append(Problem(display_path(config.source), f"pipelines[{i}].strategy", why))
    return problems



def describe_plan(config: RunConfig, slots: list[Slot], inventory: Inventory,
                  held: Holdings | None = None) -> list[str]:
    """Human lines saying what would launch where, for `torchherd check` and the picker: the devices, what
    other runs and programs hold now (`held`: the ledger's leases and NVML's foreign processes), and each
    pipeline's grant, or what it would wait for."""
    held = held or Holdings()
    lines = []
    if inventory.gpus:
        for g in inventory.gpus:
            memory = "memory n/a" if g.memory_total is None else f"{g.memory_total / 2**30:.1f} GiB"
            lines.append(f"GPU {g.index}: {g.name}, {memory} ({g.uuid})")
    else:
        lines.append(inventory.note or "no NVIDIA GPU; using CPU slots")
    lines.append(f"{len(slots)} slot{'s' if len(slots) != 1 else ''}: " + ", ".join(s.label for s in slots))
    lines += held_lines(slots, held)
    by_name = {p.name: p for p in config.pipelines}
    taken, waiting = list(held.leases), 0
    policy = Policy(config.devices.keep_free, config.devices.share)
    for name in order_pipelines(config):
        p = by_name[name]
        got = grant(request_of(p, slots), slots, taken, THIS_RUN, held.occupancy, held.links, policy) \
            if not waiting else None  # strict order, as the scheduler: nobody overtakes
        if isinstance(got, list):
            taken += leases_for(got, THIS_RUN, name, 0)
            where = " + ".join(s.label for s in got)
            if p.elastic:
                ranks = f"{len(got)} rank{'s' if len(got) != 1 else ''}"
                where = f"an elastic gang of {ranks} ({p.min_ranks} to {p.max_ranks}) on {where}"
            elif p.max_ranks > 1:
                where = f"a gang of {p.max_ranks} ranks on {where}"
        else:
            waiting += 1
            where = f"queued (#{waiting}), " + (got.why if got is not None else "behind the pipelines above")
        lines.append(f"{name}: {runner_for(p.kind).describe(p)} -> {where}")
    plan = plan_validation(config, slots, inventory, held.gpus_taken())
    if plan.mode != ValidationMode.OFF and not reports_validation(config.pipelines, plan.mode):
        lines.append(f"validation: none: no pipeline reports {config.validation.metric} ({TO_VALIDATE})")
    elif plan.mode != ValidationMode.OFF and \
            not any(runner_for(p.kind).scored_in_background(p) for p in config.pipelines):
        # Worded the same for one script or several (one was 'no validator', two 'inline (no spare core)').
        v = config.validation
        lines.append(f"validation: each script's own (its val_metrics lines; no validator), best by {v.metric} "
                     f"({v.metric_mode})")
    else:
        lines.append(validation_line(config, plan))
    r = config.restart
    lines.append(f"restarts: up to {r.max_restarts}, backoff {r.backoff:g}s..{r.backoff_max:g}s, "
                 f"min uptime {r.min_uptime:g}s")
    t = config.tracking
    trackers = ([f"MLflow {t.mlflow}"] if t.mlflow else []) + ([f"W&B {t.wandb}"] if t.wandb else []) + t.sinks
    if trackers:
        lines.append("tracking: " + ", ".join(trackers) + " (logs in the run's tracking/ folder)")
    return lines
