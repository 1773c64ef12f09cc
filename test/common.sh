# shellcheck shell=bash source-path=SCRIPTDIR
# The body of the ModelZoo-style drivers in test/ (sourced by each; see README.md, "ModelZoo-style drivers"):
#   train_full_1p.sh         accuracy run, one device
#   train_full_8p.sh         accuracy run, one process per device (default 8)
#   train_performance_1p.sh  bounded run for FPS, one device
#   train_performance_8p.sh  bounded run for FPS, one process per device
# Each calls drv_main full|performance 1p|8p "$@".
#
# Defaults come from the recipe <arch>_1p / <arch>_8p in trainer/recipes.json (read with
# python3 -m trainer.recipes); explicit arguments win. An arch without a recipe runs with main.py's
# defaults plus the arguments given. Results come from the run's summary.json through
# tools/acceptance.py: the three ModelZoo result lines, <CaseName>.log, and the optional baseline check.
#
# Exit codes: 0 done, 1 the run failed, 2 bad input (one line on stderr), 3 a baseline check failed,
# 130 / 143 interrupted.

DRV_TEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
DRV_ROOT=$(dirname "$DRV_TEST_DIR")
DRV_PY=${PYTHON:-python3}
DRV_VALUE_KEYS=" data_path arch batch_size epochs lr device device_id rank_size device_list workers precision resume output_dir baseline acc_tolerance fps_ratio steps "
# main.py flags the drivers set themselves (use the driver's --key=value instead)
DRV_OWNED=" --arch --batch-size --lr --learning-rate --epochs --workers --device --gpu --device-list --device_list --output-dir --resume --recipe --amp --amp-impl --opt-level --opt_level --dummy --data --evaluate --multiprocessing-distributed --world-size --rank --local-rank --local_rank "
DRV_OWNED_SHORT=" -a -b -j -e "
DRV_PERF_STEPS=1000
DRV_STOP_GRACE=15

drv_error() {
    printf 'error: %s\n' "$*" >&2
    exit 2
}

drv_usage() {
    local extra="" scale_args
    if [[ $DRV_SCALE == 1p ]]; then
        scale_args="  --device_id=N          device index (default: \$ASCEND_DEVICE_ID, else 0)"
    else
        scale_args="  --rank_size=N          number of processes, one per device (default 8)
  --device_list=IDS      devices, e.g. 0-7, 0,1,2,3 or 0-3,6 (default 0..rank_size-1)"
    fi
    if [[ $DRV_MODE == performance ]]; then
        extra="
  --steps=N              training steps per epoch (default ${DRV_PERF_STEPS}); epochs default to 1"
    fi
    cat <<EOF
usage: bash test/${DRV_SCRIPT} --data_path=DIR [--key=value ...] [-- main.py flags]

$( [[ $DRV_MODE == full ]] && echo "Accuracy run" || echo "Performance (FPS) run" ) of main.py in the Ascend ModelZoo style, $( [[ $DRV_SCALE == 1p ]] && echo "on one device" || echo "one process per device (shell loop)" ).
Defaults come from the recipe <arch>_${DRV_SCALE} in trainer/recipes.json; arguments given win.

  --data_path=DIR        ImageNet-style folder (train/, val/) or tiny-imagenet-200 (required unless --dummy)
  --dummy                synthetic data instead of --data_path
  --arch=NAME            model (default resnet50; shufflenet_v2_x1_0 runs shufflenet_v2_x1_0_npu)
  --batch_size=N         GLOBAL batch (default: the recipe's)
  --epochs=N             epochs (default: the recipe's)
  --lr=X                 peak learning rate (default: the recipe's, scaled linearly when the batch differs)
  --device=KIND          auto | npu | cuda | cpu (default auto)
${scale_args}
  --workers=N            data loading workers per node (default: the recipe's)
  --precision=P          O2 | O1 | fp32 (default: the recipe's opt level; fp32 without a recipe)
  --resume=auto|PATH     continue a run (auto: the newest checkpoint in --output_dir)
  --output_dir=DIR       default test/output/\${ASCEND_DEVICE_ID:-0}; an earlier run there is moved aside${extra}
  --baseline=FILE        check the result: 'published' (baselines/published.json) or a JSON / CSV table
  --acc_tolerance=X      Acc@1 points allowed below the baseline (default 1.0)
  --fps_ratio=X          fraction of the baseline FPS required (default 0.9)
  -- ARGS                passed to main.py unchanged (e.g. -- --seed 60 --port 29688)
EOF
}

drv_int() {  # name value min
    [[ $2 =~ ^[0-9]+$ ]] || drv_error "--$1 must be a whole number, got '$2'"
    (( 10#$2 >= $3 )) || drv_error "--$1 must be at least $3, got $2"
}

drv_float() {  # name value
    [[ $2 =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] || drv_error "--$1 must be a non-negative number, got '$2'"
}

drv_calc() {  # awk expression over a, b, c -> number
    awk -v a="$2" -v b="${3:-0}" -v c="${4:-0}" "BEGIN { printf \"%.6g\", $1 }"
}

drv_abspath() {
    if realpath -m / >/dev/null 2>&1; then
        realpath -m -- "$1"
    else
        case $1 in
            /*) printf '%s\n' "$1" ;;
            *) printf '%s/%s\n' "$PWD" "$1" ;;
        esac
    fi
}

drv_last_line() {  # file [remove]: its last non-empty line (at most 300 characters)
    local l
    l=$(awk 'NF { l = $0 } END { print l }' "$1" 2>/dev/null) || l=""
    [[ -z ${2:-} ]] || rm -f "$1"
    printf '%s' "${l:0:300}"
}

drv_is_within() {  # path dir: path is dir or below it
    [[ $1 == "$2" || $1 == "${2%/}"/* ]]
}

# ---------------------------------------------------------------- arguments

drv_parse() {
    opt_data_path="" opt_arch="" opt_batch_size="" opt_epochs="" opt_lr="" opt_device="" opt_device_id=""
    opt_rank_size="" opt_device_list="" opt_workers="" opt_precision="" opt_resume="" opt_output_dir=""
    opt_baseline="" opt_acc_tolerance="" opt_fps_ratio="" opt_steps="" opt_dummy=0
    DRV_PASS=()
    local arg key value
    while (($#)); do
        arg=$1
        case $arg in
            --)
                shift
                DRV_PASS=("$@")
                break
                ;;
            -h | --help)
                drv_usage
                exit 0
                ;;
            --dummy) opt_dummy=1 ;;
            --dummy=*) drv_error "--dummy takes no value" ;;
            --*=*)
                key=${arg%%=*}
                value=${arg#*=}
                key=${key#--}
                [[ $DRV_VALUE_KEYS == *" $key "* ]] ||
                    drv_error "unknown argument '--${key}' for ${DRV_SCRIPT} (see --help; main.py flags go after --)"
                [[ -n $value ]] || drv_error "--${key} needs a value: --${key}=..."
                case $key in
                    device_id) [[ $DRV_SCALE == 1p ]] ||
                        drv_error "--device_id is for the 1p scripts; ${DRV_SCRIPT} takes --device_list=IDS or --rank_size=N" ;;
                    rank_size | device_list) [[ $DRV_SCALE == 8p ]] ||
                        drv_error "--${key} is for the 8p scripts; ${DRV_SCRIPT} runs one process (pick its device with --device_id=N)" ;;
                    steps) [[ $DRV_MODE == performance ]] ||
                        drv_error "--steps is for the performance scripts; to shorten a full run pass -- --max-steps-per-epoch N" ;;
                esac
                printf -v "opt_${key}" '%s' "$value"
                ;;
            *)
                key=${arg#--}
                if [[ $arg == --* && $DRV_VALUE_KEYS == *" $key "* ]]; then
                    drv_error "--${key} needs a value: --${key}=..."
                fi
                drv_error "unknown argument '${arg}' for ${DRV_SCRIPT} (see --help; main.py flags go after --)"
                ;;
        esac
        shift
    done
}

drv_check_passthrough() {
    local i=0 n=${#DRV_PASS[@]} tok name owned
    DRV_PASS_PORT=""
    while ((i < n)); do
        tok=${DRV_PASS[i]}
        if [[ $tok == --?* ]]; then
            name=${tok%%=*}
            for owned in $DRV_OWNED; do
                if [[ $owned == "$name"* ]]; then
                    drv_error "'${tok}' after --: ${DRV_SCRIPT} sets ${owned} itself (use its --key=value arguments, see --help)"
                fi
            done
            if [[ $DRV_MODE == performance && --max-steps-per-epoch == "$name"* && ${#name} -ge 4 ]]; then
                drv_error "'${tok}' after --: the performance scripts set --max-steps-per-epoch (use --steps=N)"
            fi
            if [[ $name == --port ]]; then
                if [[ $tok == --port=* ]]; then
                    DRV_PASS_PORT=${tok#--port=}
                elif ((i + 1 < n)); then
                    DRV_PASS_PORT=${DRV_PASS[i + 1]}
                fi
            fi
        elif [[ $tok == -[a-zA-Z]* ]]; then
            if [[ $DRV_OWNED_SHORT == *" ${tok:0:2} "* ]]; then
                drv_error "'${tok}' after --: ${DRV_SCRIPT} sets ${tok:0:2} itself (use its --key=value arguments, see --help)"
            fi
        fi
        i=$((i + 1))
    done
}

drv_parse_device_list() {  # IDS -> DRV_DEVICES
    local text=$1 part lo hi id
    local -A seen=()
    DRV_DEVICES=()
    local parts=()
    IFS=, read -r -a parts <<<"$text"
    ((${#parts[@]})) || drv_error "--device_list is empty"
    for part in "${parts[@]}"; do
        part=${part// /}
        if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
            lo=$((10#${BASH_REMATCH[1]}))
            hi=$((10#${BASH_REMATCH[2]}))
            ((hi >= lo)) || drv_error "--device_list: range '${part}' runs backwards (write ${hi}-${lo})"
        elif [[ $part =~ ^[0-9]+$ ]]; then
            lo=$((10#$part))
            hi=$lo
        else
            drv_error "--device_list: '${part}' is not a device id or range (use e.g. 0-7, 0,1,2,3 or 0-3,6)"
        fi
        for ((id = lo; id <= hi; id++)); do
            [[ -z ${seen[$id]:-} ]] || drv_error "--device_list '${text}' names device ${id} twice"
            seen[$id]=1
            DRV_DEVICES+=("$id")
        done
    done
}

# ---------------------------------------------------------------- defaults and checks

drv_read_defaults() {  # recipe name -> DRV_DEF[...] (main.py defaults, recipe values if it exists)
    local line out errf
    command -v "$DRV_PY" >/dev/null 2>&1 || drv_error "python '${DRV_PY}' not found (set PYTHON=/path/to/python3)"
    errf=$(mktemp)
    out=$(cd "$DRV_ROOT" && "$DRV_PY" - "$1" 2>"$errf" <<'EOF'
import sys
from trainer import recipes
if sys.argv[1] in recipes.names():
    print("recipe={}".format(sys.argv[1]))
    for k, v in recipes.get(sys.argv[1]).items():
        if k != "source":
            print("recipe_{}={}".format(k, v))
else:  # main.py's own defaults (its parser imports torch: only asked when there is no recipe)
    from trainer.config import build_parser
    p = build_parser()
    for k in ("batch_size", "lr", "epochs", "workers"):
        print("default_{}={}".format(k, p.get_default(k)))
EOF
    ) || drv_error "cannot read the recipes and main.py's defaults with '${DRV_PY}': $(drv_last_line "$errf" 1)"
    rm -f "$errf"
    declare -gA DRV_DEF=()
    while IFS= read -r line; do
        if [[ $line == *=* ]]; then
            DRV_DEF[${line%%=*}]=${line#*=}
        fi
    done <<<"$out"
}

drv_resolve() {
    DRV_NOTES=()
    # -- data
    if ((opt_dummy)); then
        [[ -z $opt_data_path ]] || drv_error "give --data_path=DIR or --dummy, not both"
    else
        [[ -n $opt_data_path ]] || drv_error "--data_path=DIR is required (an ImageNet-style folder or tiny-imagenet-200; or --dummy)"
        [[ -d $opt_data_path ]] || drv_error "--data_path '${opt_data_path}' is not a folder"
    fi
    # -- simple values
    [[ -z $opt_batch_size ]] || drv_int batch_size "$opt_batch_size" 1
    [[ -z $opt_epochs ]] || drv_int epochs "$opt_epochs" 1
    [[ -z $opt_workers ]] || drv_int workers "$opt_workers" 0
    [[ -z $opt_steps ]] || drv_int steps "$opt_steps" 1
    [[ -z $opt_device_id ]] || drv_int device_id "$opt_device_id" 0
    [[ -z $opt_lr ]] || drv_float lr "$opt_lr"
    [[ -z $opt_acc_tolerance ]] || drv_float acc_tolerance "$opt_acc_tolerance"
    [[ -z $opt_fps_ratio ]] || drv_float fps_ratio "$opt_fps_ratio"
    if [[ -n $opt_acc_tolerance || -n $opt_fps_ratio ]] && [[ -z $opt_baseline ]]; then
        drv_error "--acc_tolerance / --fps_ratio apply to a baseline check: add --baseline=published or --baseline=FILE"
    fi
    device=${opt_device:-auto}
    case $device in
        auto | npu | cuda | cpu) ;;
        *) drv_error "--device must be auto, npu, cuda or cpu, got '${device}'" ;;
    esac
    case ${opt_precision} in
        "") ;;
        O1 | o1) opt_precision=O1 ;;
        O2 | o2) opt_precision=O2 ;;
        fp32 | FP32) opt_precision=fp32 ;;
        *) drv_error "--precision must be O2, O1 or fp32, got '${opt_precision}'" ;;
    esac
    if [[ -n $opt_resume && $opt_resume != auto && ! -f $opt_resume ]]; then
        drv_error "--resume '${opt_resume}' is not a file (give a checkpoint file, or auto)"
    fi
    drv_check_passthrough

    # -- ranks and devices
    if [[ $DRV_SCALE == 1p ]]; then
        ranks=1
        device_id=${opt_device_id:-${ASCEND_DEVICE_ID:-0}}
        drv_int "device_id (or ASCEND_DEVICE_ID)" "$device_id" 0
        device_id=$((10#$device_id))
    else
        if [[ -n $opt_rank_size ]]; then
            drv_int rank_size "$opt_rank_size" 1
            opt_rank_size=$((10#$opt_rank_size))
        fi
        if [[ -n $opt_device_list ]]; then
            drv_parse_device_list "$opt_device_list"
            if [[ -n $opt_rank_size && $opt_rank_size -ne ${#DRV_DEVICES[@]} ]]; then
                drv_error "--rank_size=${opt_rank_size} but --device_list=${opt_device_list} names ${#DRV_DEVICES[@]} device(s)"
            fi
            ranks=${#DRV_DEVICES[@]}
        else
            ranks=${opt_rank_size:-8}
            drv_parse_device_list "0-$((ranks - 1))"
        fi
        device_list=$(IFS=,; echo "${DRV_DEVICES[*]}")
        if [[ -n $DRV_PASS_PORT ]]; then
            if ! [[ $DRV_PASS_PORT =~ ^[0-9]+$ ]] || ((10#$DRV_PASS_PORT < 1 || 10#$DRV_PASS_PORT > 65535)); then
                drv_error "--port '${DRV_PASS_PORT}' after --: the ranks need one fixed port, 1-65535"
            fi
        fi
    fi

    # -- arch, recipe and defaults
    arch=${opt_arch:-resnet50}
    network=${arch%_npu}
    case $network in
        shufflenet_v2_x0_5 | shufflenet_v2_x1_0 | shufflenet_v2_x1_5 | shufflenet_v2_x2_0) model=${network}_npu ;;
        *) model=$arch ;;
    esac
    drv_read_defaults "${network}_${DRV_SCALE}"
    recipe=${DRV_DEF[recipe]:-}
    if [[ -n $recipe ]]; then
        local r_ranks=${DRV_DEF[recipe_rank_size]:-1} r_batch=${DRV_DEF[recipe_batch_size]} r_lr=${DRV_DEF[recipe_lr]}
        local r_epochs=${DRV_DEF[recipe_epochs]} r_workers=${DRV_DEF[recipe_workers]:-}
        local r_warmup=${DRV_DEF[recipe_warmup_epochs]:-0}
        model=${DRV_DEF[recipe_arch]:-$model}
        if [[ -n $opt_batch_size ]]; then
            batch_size=$((10#$opt_batch_size))
        elif ((r_batch * ranks % r_ranks == 0)); then
            batch_size=$((r_batch * ranks / r_ranks))
            ((ranks == r_ranks)) || DRV_NOTES+=("batch ${batch_size}: recipe ${recipe} has ${r_batch} for ${r_ranks} device(s); the per-device batch is kept")
        else
            drv_error "recipe ${recipe} has batch ${r_batch} for ${r_ranks} device(s), which does not scale to ${ranks}: give --batch_size"
        fi
        if [[ -n $opt_lr ]]; then
            lr=$opt_lr
        elif ((batch_size == r_batch)); then
            lr=$r_lr
        else
            lr=$(drv_calc "a * b / c" "$r_lr" "$batch_size" "$r_batch")
            DRV_NOTES+=("lr ${lr}: recipe ${recipe} has ${r_lr} for batch ${r_batch}, scaled linearly to batch ${batch_size} (--lr sets it)")
        fi
        if [[ $DRV_MODE == performance ]]; then
            epochs=${opt_epochs:-1}
        else
            epochs=${opt_epochs:-$r_epochs}
        fi
        epochs=$((10#$epochs))
        if [[ -n $opt_workers ]]; then
            workers=$((10#$opt_workers))
        elif [[ -n $r_workers ]]; then
            workers=$((r_workers * ranks / r_ranks))  # per node; the same number per process as the recipe
        else
            workers=""  # main.py's default
        fi
        warmup=""
        if [[ $(drv_calc "(a > b) ? 1 : 0" "$r_warmup" "$epochs") == 1 ]]; then
            warmup=$(drv_calc "b * a / c" "$r_warmup" "$epochs" "$r_epochs")
            DRV_NOTES+=("warm-up ${warmup} epochs: the recipe's ${r_warmup} of ${r_epochs} epochs, in proportion to ${epochs} epoch(s)")
        fi
        precision=${opt_precision:-${DRV_DEF[recipe_opt_level]:-O2}}
    else
        batch_size=$((10#${opt_batch_size:-${DRV_DEF[default_batch_size]}}))
        lr=${opt_lr:-${DRV_DEF[default_lr]}}
        if [[ $DRV_MODE == performance ]]; then
            epochs=${opt_epochs:-1}
        else
            epochs=${opt_epochs:-${DRV_DEF[default_epochs]}}
        fi
        epochs=$((10#$epochs))
        workers=$((10#${opt_workers:-${DRV_DEF[default_workers]}}))
        warmup=""
        precision=${opt_precision:-fp32}
        DRV_NOTES+=("no recipe ${network}_${DRV_SCALE} in trainer/recipes.json: main.py's defaults plus the arguments given")
    fi
    if ((batch_size % ranks)); then
        drv_error "--batch_size ${batch_size} (global) does not divide over ${ranks} ranks: use a multiple of ${ranks}"
    fi
    steps=""
    if [[ $DRV_MODE == performance ]]; then
        steps=$((10#${opt_steps:-$DRV_PERF_STEPS}))
        case_mode=perf
    else
        case_mode=acc
    fi

    # -- baseline: checked now, not after hours of training
    if [[ -n $opt_baseline ]]; then
        local bargs=(baseline --baseline "$opt_baseline" --arch "$network" --rank-size "$ranks" --mode "$case_mode")
        [[ -z $opt_acc_tolerance ]] || bargs+=(--acc-tolerance "$opt_acc_tolerance")
        [[ -z $opt_fps_ratio ]] || bargs+=(--fps-ratio "$opt_fps_ratio")
        "$DRV_PY" "$DRV_ROOT/tools/acceptance.py" "${bargs[@]}" || exit 2
    fi

    # -- output folder: keep (resume), move aside, or refuse
    if [[ -n $opt_output_dir ]]; then
        output_dir=$(drv_abspath "$opt_output_dir")
    elif [[ $DRV_SCALE == 1p ]]; then
        output_dir=$DRV_ROOT/test/output/$device_id
    else
        output_dir=$DRV_ROOT/test/output/${ASCEND_DEVICE_ID:-0}
    fi
    [[ ! -e $output_dir || -d $output_dir ]] || drv_error "--output_dir '${output_dir}' is a file, not a folder"
    output_action=new
    if [[ -d $output_dir && -n $(ls -A "$output_dir" 2>/dev/null) ]]; then
        if [[ -n $opt_resume ]] && { [[ $opt_resume == auto ]] || drv_is_within "$(drv_abspath "$opt_resume")" "$output_dir"; }; then
            output_action=keep
        else
            local guard
            for guard in / "${HOME:-/}" "$DRV_ROOT" "$PWD" ${opt_data_path:+"$(drv_abspath "$opt_data_path")"}; do
                if drv_is_within "$(drv_abspath "$guard")" "$output_dir"; then
                    drv_error "--output_dir '${output_dir}' holds files and contains ${guard}: it cannot be moved aside; choose an empty or new folder"
                fi
            done
            output_action=move
        fi
    fi
}

drv_precision_flags() {  # -> DRV_PREC (main.py flags); may ask python which device and amp exist
    DRV_PREC=()
    [[ $precision == fp32 ]] && return 0
    if [[ $device == cpu ]]; then
        DRV_PREC=(--amp --opt-level "$precision")  # bfloat16 autocast; the level is recorded only
        return 0
    fi
    local probe kind impl errf line
    errf=$(mktemp)
    probe=$(cd "$DRV_ROOT" && "$DRV_PY" -c "
import sys
from trainer import device as d
from trainer.errors import UsageError
try:
    kind = d.resolve_kind(sys.argv[1])
except UsageError as exc:
    sys.stderr.write('error: {}\n'.format(exc))
    sys.exit(2)
print(kind, 'apex' if kind != 'cpu' and d.apex_amp() is not None else 'native')
" "$device" 2>"$errf") || {
        line=$(drv_last_line "$errf" 1)
        if [[ $line == "error: "* ]]; then
            drv_error "${line#error: }"
        fi
        drv_error "cannot ask ${DRV_PY} about --device=${device}: ${line}"
    }
    rm -f "$errf"
    read -r kind impl <<<"$probe"
    if [[ $impl == apex ]]; then
        DRV_PREC=(--amp --amp-impl apex --opt-level "$precision")
    else
        DRV_PREC=(--amp --opt-level "$precision")
        if [[ $kind != cpu ]]; then
            DRV_NOTES+=("precision ${precision}: apex is not installed, so mixed precision is native autocast with a GradScaler")
        fi
    fi
}

# ---------------------------------------------------------------- launch, supervise, stop

drv_build_command() {
    DRV_CMD=("$DRV_PY" -u "$DRV_ROOT/main.py")
    if ((opt_dummy)); then
        DRV_CMD+=(--dummy)
    else
        DRV_CMD+=("$opt_data_path")
    fi
    DRV_CMD+=(-a "$model" -b "$batch_size" --lr "$lr" --epochs "$epochs")
    [[ -z $workers ]] || DRV_CMD+=(-j "$workers")
    DRV_CMD+=(--device "$device" --output-dir "$output_dir")
    [[ -z $recipe ]] || DRV_CMD+=(--recipe "$recipe")
    [[ -z $warmup ]] || DRV_CMD+=(--warmup-epochs "$warmup")
    [[ -z $steps ]] || DRV_CMD+=(--max-steps-per-epoch "$steps" --no-validate)
    [[ -z $opt_resume ]] || DRV_CMD+=(--resume "$opt_resume")
    DRV_CMD+=(${DRV_PREC[@]+"${DRV_PREC[@]}"})
    if [[ $DRV_SCALE == 1p ]]; then
        [[ $device == cpu ]] || DRV_CMD+=(--gpu "$device_id")
    else
        DRV_CMD+=(--device-list "$device_list")
    fi
    DRV_CMD+=(${DRV_PASS[@]+"${DRV_PASS[@]}"})
}

drv_free_port() {
    "$DRV_PY" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1]); s.close()"
}

drv_signal_rank() {  # signal rank: its process group, else its pid
    local pid=${DRV_PIDS[$2]}
    kill -s "$1" -- "-$pid" 2>/dev/null || kill -s "$1" "$pid" 2>/dev/null || true
}

drv_alive() {  # rank -> 0 if still running
    [[ -z ${DRV_RC[$1]:-} ]] && kill -0 "${DRV_PIDS[$1]}" 2>/dev/null
}

drv_reap() {  # collect exit codes of ranks that ended
    local r rc
    for r in "${!DRV_PIDS[@]}"; do
        if [[ -z ${DRV_RC[r]:-} ]] && ! kill -0 "${DRV_PIDS[r]}" 2>/dev/null; then
            rc=0
            wait "${DRV_PIDS[r]}" 2>/dev/null || rc=$?
            DRV_RC[r]=$rc
        fi
    done
}

drv_stop_all() {  # first signal, then SIGKILL after the grace period
    local sig=$1 r t left
    for r in "${!DRV_PIDS[@]}"; do
        drv_signal_rank "$sig" "$r"
    done
    for ((t = 0; t < DRV_STOP_GRACE * 5; t++)); do
        drv_reap
        left=0
        for r in "${!DRV_PIDS[@]}"; do
            if [[ -z ${DRV_RC[r]:-} ]]; then left=1; fi
        done
        ((left)) || break
        sleep 0.2
    done
    for r in "${!DRV_PIDS[@]}"; do
        drv_signal_rank KILL "$r"  # also any data loader worker left in the group
    done
    drv_reap
}

drv_on_signal() {
    local sig=$1
    local r alive=0
    trap - INT TERM
    for r in "${!DRV_PIDS[@]}"; do
        if drv_alive "$r"; then alive=1; fi
    done
    if ((alive)); then
        printf 'interrupted (SIG%s): stopping all ranks\n' "$sig" >&3
        if [[ $sig == INT ]]; then
            drv_stop_all "$DRV_INT"  # main.py records the interruption in summary.json
        else
            drv_stop_all TERM
        fi
        printf 'interrupted: all ranks stopped; logs in %s\n' "$output_dir" >&3
    fi
    [[ $sig == INT ]] && exit 130
    exit 143
}

drv_on_exit() {
    local r
    for r in "${!DRV_PIDS[@]}"; do
        if drv_alive "$r"; then
            drv_stop_all TERM
            break
        fi
    done
}

drv_launch() {
    local r log bind port="" kcores cores=1 launcher=()
    DRV_PIDS=()
    DRV_RC=()
    DRV_LOGS=()
    exec 3>&2  # the supervisor's messages; fd 2 is muted while it waits (see drv_main)
    trap 'drv_on_signal INT' INT
    trap 'drv_on_signal TERM' TERM
    trap drv_on_exit EXIT
    # each rank in its own process group (stopped as a whole); only without job control,
    # where setsid does not fork
    if [[ $- != *m* ]] && command -v setsid >/dev/null 2>&1; then
        launcher=(setsid)
    fi
    # a background command of a script starts with SIGINT ignored, and python then never raises
    # KeyboardInterrupt: give the ranks SIGINT back (GNU env >= 8.31), else stop them with SIGTERM
    DRV_INT=TERM
    if env --default-signal=INT true >/dev/null 2>&1; then
        DRV_INT=INT
    fi
    if [[ $DRV_SCALE == 8p ]]; then
        port=${DRV_PASS_PORT:-$(drv_free_port)}
        [[ -n $port ]] || drv_error "could not find a free port for the ranks: pass -- --port N"
        if [[ $(uname -m) == aarch64 ]] && command -v taskset >/dev/null 2>&1; then
            cores=$(nproc 2>/dev/null || echo 0)
        fi
    fi
    kcores=$((cores / ranks))
    for ((r = 0; r < ranks; r++)); do
        log=$output_dir/train_${r}.log
        DRV_LOGS[r]=$log
        bind=()
        # torchrun's variables would take precedence over the shell-loop ones: never inherit them
        local envs=(env -u RANK -u WORLD_SIZE -u LOCAL_WORLD_SIZE -u GROUP_RANK -u ROLE_RANK)
        [[ $DRV_INT == TERM ]] || envs+=(--default-signal=INT)
        if [[ $DRV_SCALE == 1p ]]; then
            envs+=(-u RANK_ID -u RANK_SIZE -u LOCAL_RANK PYTHONUNBUFFERED=1)
        else
            envs+=(PYTHONUNBUFFERED=1 RANK_ID="$r" LOCAL_RANK="$r" RANK_SIZE="$ranks" MASTER_ADDR=127.0.0.1
                MASTER_PORT="$port")
            if ((kcores >= 1 && cores > 1)); then
                bind=(taskset -c "$((r * kcores))-$((r * kcores + kcores - 1))")
            fi
        fi
        if [[ $output_action == keep ]]; then
            ${launcher[@]+"${launcher[@]}"} "${envs[@]}" ${bind[@]+"${bind[@]}"} "${DRV_CMD[@]}" >>"$log" 2>&1 </dev/null 3>&- &
        else
            ${launcher[@]+"${launcher[@]}"} "${envs[@]}" ${bind[@]+"${bind[@]}"} "${DRV_CMD[@]}" >"$log" 2>&1 </dev/null 3>&- &
        fi
        DRV_PIDS[r]=$!
        if [[ $DRV_SCALE == 1p ]]; then
            echo "started: pid ${DRV_PIDS[r]}, log ${log}"
        else
            echo "rank ${r}: pid ${DRV_PIDS[r]}, device ${DRV_DEVICES[r]}, log ${log}${bind[1]:+, cores ${bind[2]}}"
        fi
    done
}

drv_wait() {  # until every rank ended; on the first failure stop the rest and exit
    local r rc left failed pick log last why
    while :; do
        drv_reap
        left=0
        failed=()
        for r in "${!DRV_PIDS[@]}"; do
            if [[ -z ${DRV_RC[r]:-} ]]; then
                left=1
            elif ((DRV_RC[r] != 0)); then
                failed+=("$r")
            fi
        done
        if ((${#failed[@]})); then
            pick=${failed[0]}
            for r in "${failed[@]}"; do  # a rank that was killed is the cause, not its peers
                if ((DRV_RC[r] > 128)); then
                    pick=$r
                    break
                fi
            done
            if ((left)); then
                drv_stop_all TERM
            fi
            rc=${DRV_RC[pick]}
            log=${DRV_LOGS[pick]}
            last=$(drv_last_line "$log")
            if ((rc > 128)); then
                why="was killed by signal $((rc - 128))"
            else
                why="failed with exit code ${rc}"
            fi
            if [[ $DRV_SCALE == 1p ]]; then
                printf 'error: the run (pid %s) %s%s; log: %s\n' "${DRV_PIDS[pick]}" "$why" \
                    "${last:+ (last log line: ${last})}" "$log" >&3
            else
                printf 'error: rank %s (pid %s) %s%s; the other ranks were stopped; log: %s\n' "$pick" \
                    "${DRV_PIDS[pick]}" "$why" "${last:+ (last log line: ${last})}" "$log" >&3
            fi
            ((rc == 2)) && exit 2
            exit 1
        fi
        ((left)) || return 0
        sleep 0.2
    done
}

drv_report() {
    local args=(report --summary "$output_dir/summary.json" --network "$network" --rank-size "$ranks"
        --batch-size "$batch_size" --mode "$case_mode" --out-dir "$output_dir")
    if [[ -n $opt_baseline ]]; then
        args+=(--baseline "$opt_baseline" --arch "$network")
        [[ -z $opt_acc_tolerance ]] || args+=(--acc-tolerance "$opt_acc_tolerance")
        [[ -z $opt_fps_ratio ]] || args+=(--fps-ratio "$opt_fps_ratio")
    fi
    local rc=0
    "$DRV_PY" "$DRV_ROOT/tools/acceptance.py" "${args[@]}" || rc=$?
    return "$rc"
}

# ---------------------------------------------------------------- entry

drv_main() {
    DRV_MODE=$1
    DRV_SCALE=$2
    shift 2
    DRV_SCRIPT=train_${DRV_MODE}_${DRV_SCALE}.sh
    DRV_PIDS=()
    drv_parse "$@"
    drv_resolve
    if [[ ${etp_running_flag:-} != true ]]; then
        # shellcheck source=../env_npu.sh
        source "$DRV_ROOT/env_npu.sh"
    fi
    drv_precision_flags
    if [[ $DRV_SCALE == 1p ]]; then
        export ASCEND_DEVICE_ID=$device_id
    fi
    case $output_action in
        move)
            local stamp dest n=1
            stamp=$(date +%Y%m%d-%H%M%S)
            dest=${output_dir}.prev-${stamp}
            while [[ -e $dest ]]; do
                dest=${output_dir}.prev-${stamp}-${n}
                n=$((n + 1))
            done
            mv -- "$output_dir" "$dest" 2>/dev/null || drv_error "cannot move '${output_dir}' aside to '${dest}'"
            echo "output: the earlier contents of ${output_dir} were moved to ${dest}"
            ;;
        keep) echo "output: continuing the run in ${output_dir} (--resume=${opt_resume})" ;;
    esac
    mkdir -p -- "$output_dir" 2>/dev/null || drv_error "cannot create --output_dir '${output_dir}'"
    drv_build_command
    local note where
    for note in ${DRV_NOTES[@]+"${DRV_NOTES[@]}"}; do
        echo "note: ${note}"
    done
    if [[ $DRV_SCALE == 1p ]]; then
        where="1 process on ${device}$([[ $device == cpu ]] || echo " device ${device_id}")"
    else
        where="${ranks} processes on ${device} devices ${device_list}"
    fi
    echo "${DRV_SCRIPT}: ${model}${recipe:+ (recipe ${recipe})} | ${where} | global batch ${batch_size} | lr ${lr} | ${epochs} epoch(s)${steps:+ x ${steps} steps} | precision ${precision} | output ${output_dir}"
    echo "command: $(printf '%q ' "${DRV_CMD[@]}")"
    local t0=$SECONDS
    drv_launch
    # bash reports a background job killed by a signal ("Killed ...") on stderr; the supervisor
    # reports it itself, on fd 3
    drv_wait 2>/dev/null
    if [[ $DRV_SCALE == 1p ]]; then
        echo "finished in $((SECONDS - t0)) s"
    else
        echo "all ${ranks} ranks finished in $((SECONDS - t0)) s"
    fi
    drv_report
}
