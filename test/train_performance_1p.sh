#!/usr/bin/env bash
# Performance (FPS) run on one device: 1 epoch of at most --steps steps, Ascend ModelZoo style:
#   bash test/train_performance_1p.sh --data_path=DIR [--arch=resnet50] [--key=value ...] [-- main.py flags]
# See --help and docs/MODELZOO.md ("ModelZoo-style drivers"); the driver is modelzoo/drivers.py.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
drv_main performance 1p "$@"
