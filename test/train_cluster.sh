#!/usr/bin/env bash
# Accuracy run on several nodes (--world_size=N), one driver per node, one process per device, Ascend ModelZoo style:
#   bash test/train_cluster.sh --data_path=DIR --world_size=N --node_rank=R --master_addr=IP [--arch=resnet50]
#       [--key=value ...] [-- main.py flags]
# See --help and docs/MODELZOO.md ("ModelZoo-style drivers"); the driver is modelzoo/drivers.py.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
drv_main full cluster "$@"
