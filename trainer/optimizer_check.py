"""The optimizer and learning-rate schedule a run's settings ask for, checked before any work.

transformers builds both only when training starts, after the baseline evaluation, so a missing optimizer package
(``--trl optim=galore_adamw`` without galore-torch) or a schedule missing its arguments would fail minutes into a run,
with a traceback. Asking transformers the same questions up front gives that failure before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from nodus.core.errors import first_line

# What transformers raises for settings it cannot build (a missing package, a missing argument, a wrong type).
_SETTING_ERRORS = (ImportError, ValueError, TypeError, NotImplementedError, KeyError)
# Low-rank and LOMO optimizers need the model itself; transformers checks their package before asking for it.
_NEEDS_THE_MODEL = "You need to pass a model"
# Any positive count does: the schedule is built to see whether it can be, not used.
_PROBE_STEPS = 100


def optimizer_problem(config: Any) -> str | None:
    """What is wrong with ``config``'s optimizer or schedule (a TRL GRPOConfig), as one line; None when nothing is."""
    from transformers import Trainer
    from transformers.optimization import get_scheduler

    optim = getattr(config.optim, "value", config.optim)
    try:
        Trainer.get_optimizer_cls_and_kwargs(config, model=None)
    except _SETTING_ERRORS as error:
        if not str(error).startswith(_NEEDS_THE_MODEL):
            arguments = f" with optim_args {config.optim_args!r}" if config.optim_args else ""
            return (
                f"spec.parameters.trl.optim {optim!r}{arguments}: transformers cannot build it: {first_line(error)}; "
                f"install what it names, or leave optim unset for the default ({_default(config, 'optim')})"
            )
    schedule = getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type)
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate)
    try:
        get_scheduler(
            config.lr_scheduler_type,
            optimizer=probe,
            num_warmup_steps=config.get_warmup_steps(_PROBE_STEPS),
            num_training_steps=_PROBE_STEPS,
            scheduler_specific_kwargs=config.lr_scheduler_kwargs,
        )
    except _SETTING_ERRORS as error:
        return (
            f"spec.parameters.trl.lr_scheduler_type {schedule!r}: transformers cannot build it with "
            f"lr_scheduler_kwargs {config.lr_scheduler_kwargs or {}}: {first_line(error)}; pass what it names with "
            f"--trl 'lr_scheduler_kwargs={{...}}', or leave lr_scheduler_type unset for the default "
            f"({_default(config, 'lr_scheduler_type')})"
        )
    return None


def _default(config: Any, name: str) -> str:
    default = next(f.default for f in dataclasses.fields(config) if f.name == name)
    return str(getattr(default, "value", default))
