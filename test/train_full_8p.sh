#!/usr/bin/env bash
# Accuracy run, one process per device (default 8 devices), Ascend ModelZoo style:
#   bash test/train_full_8p.sh --data_path=DIR [--arch=resnet50] [--key=value ...] [-- main.py flags]
# See --help and docs/MODELZOO.md ("ModelZoo-style drivers"); the driver is modelzoo/drivers.py.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
drv_main full 8p "$@"
