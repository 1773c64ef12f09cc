#!/usr/bin/env bash
# Performance (FPS) run on two nodes of 8 devices, 1 epoch of at most --steps steps, Ascend ModelZoo style:
# one driver per node, each with --node_rank=0|1 and node 0's --master_addr=IP:
#   bash test/train_performance_16p.sh --data_path=DIR [--arch=resnet50] [--key=value ...] [-- main.py flags]
# See --help and docs/MODELZOO.md ("ModelZoo-style drivers"); the driver is modelzoo/drivers.py.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
drv_main performance 16p "$@"
