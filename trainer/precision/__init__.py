"""Precision: what --amp means on the device (native autocast + GradScaler, or apex) and the optimizer step that goes
with it; amp_probe: --amp-dtype auto on a CPU, measured on the run's model.

May import: trainer.device, trainer.optim, trainer.record.checkpoint, and the spine's leaves (trainer.cli,
trainer.errors, trainer.options). Imported by the spine."""

APEX_OPT_LEVEL = "O2"  # apex's opt level where --opt-level is not given (the Ascend guide's)


def amp_label(precision):
    """The precision as the run's first line and metrics.jsonl name it."""
    if not precision.enabled:
        if precision.probe is not None:
            return "off (float32: measured faster than bfloat16 here)"
        return "off" if precision.note is None else "off (float32: no native bfloat16 here)"
    return "{} {}".format(precision.impl, precision.dtype_name)
