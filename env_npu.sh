# shellcheck shell=bash
# Ascend NPU environment for training: source it (". ./env_npu.sh"); the test/ drivers do,
# unless etp_running_flag=true.
#
# - CANN: the install path comes from the Install_Path= line of
#   /etc/Ascend/ascend_cann_install.info, else /usr/local/Ascend, else /opt/Ascend (an exported
#   CANN_INSTALL_PATH wins over all; ASCEND_CANN_INSTALL_INFO names another info file); under it
#   ascend-toolkit/latest (else nnae/latest) must exist, and that product's set_env.sh is sourced
#   (once per shell).
# - Runtime settings, each only where not already set: ASCEND_SLOG_PRINT_TO_STDOUT=0,
#   ASCEND_GLOBAL_LOG_LEVEL=3, ASCEND_GLOBAL_EVENT_ENABLE=0, TASK_QUEUE_ENABLE=1, COMBINED_ENABLE=1,
#   HCCL_WHITELIST_DISABLE=1, HCCL_IF_IP (the host's first address), HCCL_CONNECT_TIMEOUT=1200,
#   HCCL_EXEC_TIMEOUT=1800 (seconds).
# - With CANN: device-side logs set to error level with msnpureport (when it is installed), the
#   running python's library folder and torch/lib put on LD_LIBRARY_PATH, and the open-files limit
#   raised to 512000 where the system allows it.
#
# Prints one line saying what it found. Safe under "set -euo pipefail", safe to source twice, and
# never exits the shell that sources it. On a machine without CANN nothing is sourced and nothing
# fails. PYTHON names the python to ask for library paths (default python3).

_env_npu_main() {
    local info=${ASCEND_CANN_INSTALL_INFO:-/etc/Ascend/ascend_cann_install.info} root="" product="" set_env="" line candidate looked
    local prefix

    # -- where CANN is
    if [[ -n ${CANN_INSTALL_PATH:-} ]]; then
        root=$CANN_INSTALL_PATH
    elif [[ -r $info ]]; then
        while IFS= read -r line || [[ -n $line ]]; do
            line=${line%$'\r'}
            if [[ $line == Install_Path=* ]]; then
                root=${line#Install_Path=}
                root=${root#"${root%%[![:space:]]*}"}
                root=${root%"${root##*[![:space:]]}"}
                break
            fi
        done <"$info"
    fi
    if [[ -z $root ]]; then
        for candidate in /usr/local/Ascend /opt/Ascend; do
            if [[ -d $candidate ]]; then
                root=$candidate
                break
            fi
        done
    fi
    if [[ -n $root ]]; then
        for product in ascend-toolkit nnae; do
            if [[ -d $root/$product/latest ]]; then
                for candidate in "$root/$product/set_env.sh" "$root/$product/latest/set_env.sh"; do
                    if [[ -f $candidate ]]; then
                        set_env=$candidate
                        break 2
                    fi
                done
            fi
        done
    fi

    # -- runtime settings (values already in the environment are kept)
    : "${ASCEND_SLOG_PRINT_TO_STDOUT:=0}"  # host logs to files, not to the console
    : "${ASCEND_GLOBAL_LOG_LEVEL:=3}"      # 0 debug, 1 info, 2 warning, 3 error
    : "${ASCEND_GLOBAL_EVENT_ENABLE:=0}"   # no event logs
    : "${TASK_QUEUE_ENABLE:=1}"            # asynchronous operator dispatch queue
    : "${COMBINED_ENABLE:=1}"              # combine non-contiguous copies
    : "${HCCL_WHITELIST_DISABLE:=1}"       # no HCCL communication whitelist
    : "${HCCL_CONNECT_TIMEOUT:=1200}"      # seconds to build the HCCL links
    : "${HCCL_EXEC_TIMEOUT:=1800}"         # seconds a collective may wait
    export ASCEND_SLOG_PRINT_TO_STDOUT ASCEND_GLOBAL_LOG_LEVEL ASCEND_GLOBAL_EVENT_ENABLE TASK_QUEUE_ENABLE \
        COMBINED_ENABLE HCCL_WHITELIST_DISABLE HCCL_CONNECT_TIMEOUT HCCL_EXEC_TIMEOUT
    if [[ -z ${HCCL_IF_IP:-} ]] && command -v hostname >/dev/null 2>&1; then
        local addrs first=""
        addrs=$(hostname -I 2>/dev/null) || addrs=""
        read -r first _ <<<"$addrs" || true
        if [[ -n $first ]]; then
            HCCL_IF_IP=$first
            export HCCL_IF_IP
        fi
    fi

    if [[ -z $set_env ]]; then
        if [[ -n $root ]]; then
            looked="${root} has no ascend-toolkit/latest or nnae/latest with a set_env.sh"
        else
            looked="no ${info}, /usr/local/Ascend or /opt/Ascend"
        fi
        echo "env_npu.sh: no CANN found (${looked}): NPU runtime settings exported, nothing sourced"
        return 0
    fi

    # -- CANN's own script, once per shell; it is not written for set -eu
    if [[ ${_ENV_NPU_SET_ENV:-} != "$set_env" ]]; then
        local saved=$-
        set +eu
        # shellcheck disable=SC1090
        source "$set_env"
        [[ $saved == *u* ]] && set -u
        [[ $saved == *e* ]] && set -e
        _ENV_NPU_SET_ENV=$set_env
    fi

    # -- device-side logs at error level, no device event logs
    if command -v msnpureport >/dev/null 2>&1; then
        local d
        for d in 0 1 2 3 4 5 6 7; do
            msnpureport -g error -d "$d" >/dev/null 2>&1 || true
        done
        msnpureport -e disable >/dev/null 2>&1 || true
    fi

    # -- open files: raise the soft limit to 512000 (and the hard one where it is lower and we may)
    local soft hard
    soft=$(ulimit -Sn 2>/dev/null) || soft=unlimited
    hard=$(ulimit -Hn 2>/dev/null) || hard=unlimited
    if [[ $soft != unlimited && $soft -lt 512000 ]]; then
        if [[ $hard == unlimited || $hard -ge 512000 ]]; then
            ulimit -Sn 512000 2>/dev/null || true
        elif (ulimit -SHn 512000) >/dev/null 2>&1; then
            ulimit -SHn 512000 2>/dev/null || true
        fi
    fi

    # -- the running python's library folder and torch/lib (torch_npu links against them)
    local py=${PYTHON:-python3} libs=""
    if command -v "$py" >/dev/null 2>&1; then
        libs=$("$py" - 2>/dev/null <<'EOF'
import os, sys, sysconfig
out = []
libdir = sysconfig.get_config_var("LIBDIR")
if libdir and os.path.isdir(libdir):
    out.append(libdir)
for p in sys.path:
    d = os.path.join(p, "torch", "lib")
    if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(d) and d not in out:
        out.append(d)
print(":".join(out))
EOF
        ) || libs=""
    fi
    if [[ -n $libs ]]; then
        local rest=${LD_LIBRARY_PATH:-} todo=$libs: dir
        prefix=""
        while [[ -n $todo ]]; do
            dir=${todo%%:*}
            todo=${todo#*:}
            case ":$rest:$prefix:" in
                *":$dir:"*) ;;
                *) prefix=${prefix:+$prefix:}$dir ;;
            esac
        done
        if [[ -n $prefix ]]; then
            LD_LIBRARY_PATH=$prefix${rest:+:$rest}
            export LD_LIBRARY_PATH
        fi
    fi
    echo "env_npu.sh: CANN at ${root} (${set_env} sourced)"
    return 0
}

_env_npu_main || true
unset -f _env_npu_main
