"""The lines a stopped run ends with (interrupted, out of memory)."""
from trainer.errors import counted


def interrupted_line(plan, signal_name=None, global_step=None):
    """The last line of a run a signal stopped (``global_step``: where its mid-epoch checkpoint continues)."""
    if plan.run.evaluate:
        return "interrupted: the evaluation stopped; nothing in '{}' was changed but its summary".format(
            plan.run.output_dir)
    by = " by {}".format(signal_name) if signal_name else ""
    at = " at global step {}".format(global_step) if global_step is not None else ""
    return "interrupted{}{}: summary and checkpoints in '{}'; continue with --resume auto".format(
        by, at, plan.run.output_dir)


def out_of_memory_line(plan, device):
    """The one line for a run that ran out of device (or host) memory: where, at which batch, what to change."""
    per_device = plan.run.batch_size // max(1, plan.launch.world_size)
    fixes = ["lower -b (now {} global{})".format(plan.run.batch_size, ", {} per device".format(per_device)
                                                  if plan.launch.world_size > 1 else "")]
    if not plan.precision.amp and device.resolve_amp_dtype("auto")[0] is not None:
        fixes.append("add --amp (half-size activations)")
    return ("out of memory on {} at {} per device ({}, {} px): {}; the checkpoints are those of the last "
            "finished epoch".format(device.name, counted(per_device, "image"), plan.model.arch,
                                    plan.data.train_crop_size, ", or ".join(fixes)))
