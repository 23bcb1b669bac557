#!/usr/bin/env bash
# A one-node SLURM cluster on localhost for the tests (facts in machine-notes.md).
#
#   scripts/slurm-cluster.sh install      apt-get slurm-wlm + munge when missing (no-op otherwise)
#   scripts/slurm-cluster.sh start DIR    munged + slurmctld + slurmd with all state under DIR;
#                                         prints `export SLURM_CONF=...` lines for the caller
#   scripts/slurm-cluster.sh stop DIR     cancel DIR's jobs, stop its daemons by their pid
#                                         files, then end what its job steps left running
#   scripts/slurm-cluster.sh restart-ctld DIR [--clean]
#                                         stop slurmctld and start it again, with its saved
#                                         state, or with none (--clean: every job forgotten,
#                                         its completion log too: the host was lost)
#   scripts/slurm-cluster.sh stop-slurmd DIR | start-slurmd DIR
#                                         the node daemon alone (a node failure, and its return)
#
# FLM_SLURM_MIN_JOB_AGE (default 300) and FLM_SLURM_SLURMD_TIMEOUT (default 300) set how long
# the controller remembers an ended job and how soon it declares a silent node DOWN; the fault
# tests start a cluster of their own with both low. FLM_SLURM_EXTRA_CONF: more slurm.conf lines.
#
# Every run keeps its config, state, spool, logs and munge socket in its own DIR and is reached
# through SLURM_CONF, so two test runs never see each other's jobs. Daemons are stopped by pid
# file, what their jobs left by the cluster's SLURM_CONF in its environment, never by process
# name, so nothing else on the machine is touched.
set -euo pipefail

die() { echo "slurm-cluster: $*" >&2; exit 1; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "$1 needs root (the daemons run as root/munge in this setup)"
}

cmd_install() {
    local missing=0
    for exe in sbatch slurmctld slurmd munged; do
        command -v "$exe" >/dev/null 2>&1 || [[ -x "/usr/sbin/$exe" ]] || missing=1
    done
    if [[ $missing -eq 0 ]]; then
        return 0
    fi
    need_root install
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
}

# Wait until CMD succeeds, at most SECONDS (tenths of a second granularity).
wait_for() {
    local seconds=$1; shift
    local tries=$((seconds * 10))
    while ! "$@" >/dev/null 2>&1; do
        tries=$((tries - 1))
        [[ $tries -gt 0 ]] || return 1
        sleep 0.1
    done
}

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_idle() {
    local state
    state=$(SLURM_CONF="$DIR/slurm.conf" sinfo -h -o %T 2>/dev/null) || return 1
    [[ $state == idle* ]]
}

cmd_start() {
    need_root start
    DIR=$(mkdir -p "$1" && cd "$1" && pwd)
    local node cpus ctld_port slurmd_port
    node=$(hostname -s)
    cpus=$(nproc)
    # Ports of this run's own: a second cluster (another test run, the benchmark) can live beside.
    local ports
    ports=$(python3 -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
    read -r ctld_port slurmd_port <<<"$ports"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge"
    chown munge:munge "$DIR/munge"
    runuser -u munge -- test -x "$DIR/munge" \
        || die "the munge user cannot reach $DIR (every parent folder must be traversable)"
    chmod 0700 "$DIR/munge"

    # munge: a key and a socket of this run's own, so the system's munged (if any) is untouched.
    if [[ ! -s "$DIR/munge/munge.key" ]]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
        chown munge:munge "$DIR/munge/munge.key"
        chmod 0400 "$DIR/munge/munge.key"
    fi
    if ! pid_alive "$DIR/munge/munged.pid"; then
        runuser -u munge -- munged \
            --key-file="$DIR/munge/munge.key" \
            --socket="$DIR/munge/munge.socket" \
            --pid-file="$DIR/munge/munged.pid" \
            --log-file="$DIR/munge/munged.log" \
            --seed-file="$DIR/munge/munged.seed" \
            --force
        wait_for 10 test -S "$DIR/munge/munge.socket" || die "munged did not start"
    fi

    cat >"$DIR/slurm.conf" <<EOF
ClusterName=local
SlurmctldHost=$node
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
InactiveLimit=0
KillWait=5
MinJobAge=${FLM_SLURM_MIN_JOB_AGE:-300}
SlurmdTimeout=${FLM_SLURM_SLURMD_TIMEOUT:-300}
MaxArraySize=10001
MaxJobCount=20000
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
${FLM_SLURM_EXTRA_CONF:-}
EOF
    export SLURM_CONF="$DIR/slurm.conf"
    # -c: a clean start, no jobs left over from an earlier run in this folder.
    if ! pid_alive "$DIR/slurmctld.pid"; then
        # Job ids restart at 1, so completion records of an earlier start would be misread.
        : >"$DIR/log/jobcomp.txt"
        slurmctld -c -f "$SLURM_CONF"
    fi
    wait_for 20 pid_alive "$DIR/slurmctld.pid" || die "slurmctld did not start (see $DIR/log)"
    pid_alive "$DIR/slurmd.pid" || slurmd -f "$SLURM_CONF"
    wait_for 20 pid_alive "$DIR/slurmd.pid" || die "slurmd did not start (see $DIR/log)"
    wait_for 30 node_idle || die "node did not become idle (see $DIR/log)"
    echo "export SLURM_CONF=$DIR/slurm.conf"
}

stop_pidfile() {
    local pidfile=$1 pid
    if pid_alive "$pidfile"; then
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        # A daemon that ignores TERM for 10 s is killed.
        wait_for 10 bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
    fi
}

cmd_restart_ctld() {
    need_root restart-ctld
    DIR=$(cd "$1" && pwd) || die "no cluster folder $1"
    export SLURM_CONF="$DIR/slurm.conf"
    stop_pidfile "$DIR/slurmctld.pid"
    rm -f "$DIR/slurmctld.pid"
    if [[ ${2:-} == --clean ]]; then
        # Job ids would start again at 1 and collide with the forgotten jobs' logs and run ids:
        # a real site's ids would go on from its last one, so this cluster's do too.
        local next
        next=$(( $(grep -o 'JobId=[0-9]*' "$DIR/log/jobcomp.txt" 2>/dev/null \
                    | cut -d= -f2 | sort -n | tail -1 || echo 0) + 1000 ))
        sed -i '/^FirstJobId=/d' "$SLURM_CONF"
        echo "FirstJobId=$next" >>"$SLURM_CONF"
        # The controller's host is gone with its state: its job-completion log goes too.
        : >"$DIR/log/jobcomp.txt"
        slurmctld -c -f "$SLURM_CONF"
    else
        slurmctld -f "$SLURM_CONF"
    fi
    wait_for 20 pid_alive "$DIR/slurmctld.pid" || die "slurmctld did not start (see $DIR/log)"
}

cmd_stop_slurmd() {
    DIR=$(cd "$1" && pwd) || die "no cluster folder $1"
    stop_pidfile "$DIR/slurmd.pid"
}

cmd_start_slurmd() {
    need_root start-slurmd
    DIR=$(cd "$1" && pwd) || die "no cluster folder $1"
    pid_alive "$DIR/slurmd.pid" || slurmd -f "$DIR/slurm.conf"
    wait_for 20 pid_alive "$DIR/slurmd.pid" || die "slurmd did not start (see $DIR/log)"
}

# No job left but COMPLETING ones: a job whose node daemon died stays COMPLETING until that
# node answers again, and its processes are ended below either way.
no_jobs() {
    # Not `! ... | grep -q`: under pipefail, squeue killed by grep's early exit would read as
    # "no jobs".
    # shellcheck disable=SC2143
    [[ -z $(SLURM_CONF="$DIR/slurm.conf" squeue -h -o '%A %t' 2>/dev/null | grep -v ' CG$') ]]
}

# The live processes that started with this cluster's SLURM_CONF in their environment, this
# script and its callers left out: job steps (slurmstepd and the tasks it runs) outlive their
# slurmd, and a job the controller forgot (restart-ctld --clean) cannot be cancelled.
cluster_processes() {
    local needle="SLURM_CONF=$DIR/slurm.conf" keep=" $$ " p file pid state
    p=$$
    while [[ $p -gt 1 ]]; do
        p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
        keep+="$p "
    done
    # One grep over every environment (NUL-separated entries, -z), not a process per pid.
    while read -r file; do
        pid=${file#/proc/}
        pid=${pid%/environ}
        [[ $keep == *" $pid "* ]] && continue
        state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
        [[ -n $state && ${state:0:1} != Z ]] && echo "$pid"
    done < <(grep -lsxzF "$needle" /proc/[0-9]*/environ 2>/dev/null)
    return 0
}

none_left() { [[ -z $(cluster_processes) ]]; }

cmd_stop() {
    DIR=$(cd "$1" && pwd) || die "no cluster folder $1"
    local pidfile pids
    # Jobs first, while the controller can still end them the way a site would.
    if pid_alive "$DIR/slurmctld.pid"; then
        SLURM_CONF="$DIR/slurm.conf" squeue -h -o %A 2>/dev/null \
            | xargs -r env SLURM_CONF="$DIR/slurm.conf" scancel 2>/dev/null || true
        wait_for 20 no_jobs || true
    fi
    for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
        stop_pidfile "$pidfile"
    done
    pids=$(cluster_processes)
    if [[ -n $pids ]]; then
        # shellcheck disable=SC2086 # one pid a word
        kill $pids 2>/dev/null || true
        # Step daemons of a forgotten job ignore TERM (they retry their last message for
        # ever): 3 s is what a task needs to record its end; then KILL.
        if ! wait_for 3 none_left; then
            pids=$(cluster_processes)
            # shellcheck disable=SC2086
            [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
        fi
    fi
}

case "${1:-}" in
    install) cmd_install ;;
    start) [[ $# -eq 2 ]] || die "usage: $0 start DIR"; cmd_install; cmd_start "$2" ;;
    stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR"; cmd_stop "$2" ;;
    restart-ctld) [[ $# -ge 2 ]] || die "usage: $0 restart-ctld DIR [--clean]"
        cmd_restart_ctld "$2" "${3:-}" ;;
    stop-slurmd) [[ $# -eq 2 ]] || die "usage: $0 stop-slurmd DIR"; cmd_stop_slurmd "$2" ;;
    start-slurmd) [[ $# -eq 2 ]] || die "usage: $0 start-slurmd DIR"; cmd_start_slurmd "$2" ;;
    *) die "usage: $0 install | start DIR | stop DIR | restart-ctld DIR [--clean] | stop-slurmd DIR | start-slurmd DIR" ;;
esac
