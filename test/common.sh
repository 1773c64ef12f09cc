# shellcheck shell=bash source-path=SCRIPTDIR
# The ModelZoo-style drivers in test/ (train_{full,performance}_{1p,8p}.sh) source this file and call
# drv_main MODE SCALE "$@": env_npu.sh is sourced (unless the platform set the environment up,
# etp_running_flag=true), then modelzoo/drivers.py takes over: arguments, recipe, output folder, one
# process per device, supervision, ModelZoo results. --help is answered before anything is sourced.
# The Python: $PYTHON, else python3 (an activated environment's, CANN's); where that python3 lacks the project's
# packages (torch, ...) and the repository's .venv (make install) has them, .venv's, said in one note line. A
# Python without them stops in one error line naming the one to use (trainer/interpreter.py), exit 2.
drv_main() {
    local root py arg
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
    py=${PYTHON:-python3}
    command -v "$py" >/dev/null 2>&1 || { echo "error: python '${py}' not found (set PYTHON=/path/to/python3)" >&2; exit 2; }
    export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
    for arg in "${@:3}"; do
        case $arg in
            --) break ;;
            -h | --help) exec "$py" -m modelzoo.drivers "$@" ;;
        esac
    done
    if [[ ${etp_running_flag:-} != true ]]; then
        # shellcheck source=../env_npu.sh
        source "$root/env_npu.sh"
    fi
    if [[ -z ${PYTHON:-} && -x $root/.venv/bin/python ]] && ! "$py" -m trainer.interpreter 2>/dev/null &&
        "$root/.venv/bin/python" -m trainer.interpreter 2>/dev/null; then
        echo "note: $(command -v "$py") lacks the project's packages (torch, ...): the driver runs" \
            "$root/.venv/bin/python (PYTHON=/path/to/python3 names another)" >&2
        py=$root/.venv/bin/python
    fi
    exec "$py" -m modelzoo.drivers "$@"
}
