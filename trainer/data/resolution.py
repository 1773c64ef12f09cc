"""The training resolution schedule (``--min-res``, ``--max-res``, ``--start-ramp``, ``--end-ramp``: FFCV's
``get_resolution``): ``min_res`` up to epoch ``start_ramp``, then a linear rise to ``max_res`` at ``end_ramp``,
rounded to the nearest multiple of 32 (numpy's round: halves to even). A function of the epoch alone: a resumed run
trains each epoch at the same size, which changes only between epochs (each shape is compiled once on an NPU).
Workers read it from their sampler's items, drawn afresh every epoch. numpy is imported where a size is computed:
``trainer.data`` imports without numpy or torch, for main.py's parser to name the Python to use where neither is."""

MULTIPLE = 32  # FFCV's rounding; also a ResNet's total stride, so every stage's feature maps divide evenly


class ResolutionSchedule:
    """``schedule(epoch)`` -> the training image size of that epoch (FFCV's ``get_resolution``)."""

    def __init__(self, min_res, max_res, start_ramp, end_ramp):
        self.min_res, self.max_res = int(min_res), int(max_res)
        self.start_ramp, self.end_ramp = int(start_ramp), int(end_ramp)

    def __call__(self, epoch):
        if epoch <= self.start_ramp:
            return self.min_res
        if epoch >= self.end_ramp:
            return self.max_res
        import numpy as np
        interp = np.interp([epoch], [self.start_ramp, self.end_ramp], [self.min_res, self.max_res])
        return int(np.round(interp[0] / MULTIPLE)) * MULTIPLE

    def changes(self, first, last):
        """[(epoch, size)] where the size changes in epochs first..last-1, the first epoch included."""
        return [(epoch, self(epoch)) for epoch in range(first, last)
                if epoch == first or self(epoch) != self(epoch - 1)]

    def __repr__(self):
        return "ResolutionSchedule({}, {}, {}, {})".format(self.min_res, self.max_res, self.start_ramp, self.end_ramp)


def schedule_of(section):
    """The schedule of the config's data section (a config.DataConfig), or None for a fixed --train-crop-size."""
    return None if section.min_res is None else ResolutionSchedule(section.min_res, section.max_res,
                                                                    section.start_ramp, section.end_ramp)


def train_size(section, epoch):
    """The training image size of ``epoch``: the schedule's, or --train-crop-size."""
    schedule = schedule_of(section)
    return section.train_crop_size if schedule is None else schedule(epoch)
