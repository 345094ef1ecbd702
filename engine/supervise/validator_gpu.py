"""The background validator's GPU on a shared machine: planned around what other runs and programs hold now, and
a spare GPU it has to itself leased in the ledger, so no other run is granted it."""
from __future__ import annotations

from ..config.schema import RunConfig
from ..hardware.devices import Inventory
from ..hardware.placement import SPARE_GPU, ValidationPlan, plan_validation
from .scheduler import Scheduler
from .validation_service import ValidationService

VALIDATOR_HOLDER = "(validator)"  # the pipeline name its lease bears, as `torchherd ls` shows it


def settle_validator_gpu(plan: ValidationPlan, config: RunConfig, scheduler: Scheduler,
                         inventory: Inventory) -> ValidationPlan:
    """`plan` with its spare GPU leased; another spare when that one is taken; as planned without a spare
    (sharing a GPU of the run's own, or the CPU) when none is left."""
    if scheduler.cluster or plan.gpu is None:
        return plan  # Ray accounts a cluster's GPUs; a validator on the CPU or as configured holds none
    taken = set(scheduler.gpus_taken([g.index for g in inventory.gpus]))
    plan = plan_validation(config, scheduler.slots, inventory, frozenset(taken))
    while plan.gpu is not None and plan.why == SPARE_GPU:
        if scheduler.lease_whole(plan.gpu.index, VALIDATOR_HOLDER):
            return plan
        taken.add(plan.gpu.index)
        plan = plan_validation(config, scheduler.slots, inventory, frozenset(taken))
    return plan


def start_validator(plan: ValidationPlan, config: RunConfig, scheduler: Scheduler, service: ValidationService,
                    inventory: Inventory) -> ValidationPlan:
    """Start the session's validator for its first config that validates in the background (its GPU settled
    first); the plan the config's pipelines go by."""
    if service.plan is None:
        plan = settle_validator_gpu(plan, config, scheduler, inventory)
    service.start_for(plan)
    return plan
