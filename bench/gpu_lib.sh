# Shared by bench/gpu_check.sh and bench/gpu_ab.sh (sourced, not run): the
# run's log files and time budget, and step(), which runs one check under its
# own time limit. The sourcing script sets OUT and BUDGET first.
LOG=$OUT/all.log
SUM=$OUT/summary.txt
mkdir -p "$OUT"
: >"$LOG"
: >"$SUM"
T0=$(date +%s)

# step NAME SECONDS CMD...: CMD's output to all.log, one summary line; a step
# named in GPU_CHECK_SKIP, or one that would start with under 10 s of the
# budget left, is skipped and says so
step() {
    local name=$1 limit=$2
    shift 2
    local now left
    case " ${GPU_CHECK_SKIP:-} " in *" $name "*)
        echo "$name skipped: GPU_CHECK_SKIP" | tee -a "$SUM"
        return ;;
    esac
    now=$(date +%s)
    left=$((BUDGET - (now - T0)))
    if [ "$left" -lt 10 ]; then
        echo "$name skipped: the run's $BUDGET s are spent" | tee -a "$SUM"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s): $*" >>"$LOG"
    local s e rc
    s=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    e=$(date +%s.%N)
    printf "%-28s rc=%-3s %6.1fs\n" "$name" "$rc" "$(awk "BEGIN{print $e - $s}")" | tee -a "$SUM"
}

# the machine, at the top of all.log
{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
    nproc
    grep -m1 "model name" /proc/cpuinfo
} >>"$LOG" 2>&1
nvidia-smi -L | tee -a "$SUM"
