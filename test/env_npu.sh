# shellcheck shell=bash
# ModelZoo's scripts source test/env_npu.sh: this is the project's env_npu.sh (one folder up), the same
# settings, as quiet and harmless where CANN is missing. Source it: ". test/env_npu.sh".
# shellcheck source-path=SCRIPTDIR source=../env_npu.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)/env_npu.sh"
