#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the `slurm` tests and for trying sweeps locally.
#
#   scripts/local_slurm.sh start    install (once), configure and start munged, slurmctld, slurmd;
#                                   wait until the node is idle; print the line clients must export
#   scripts/local_slurm.sh stop     cancel this cluster's jobs, stop the daemons started by `start`
#   scripts/local_slurm.sh status   daemons and node state; exit 0 only when all are up
#   scripts/local_slurm.sh env      print `export SLURM_CONF=...` (use: eval "$(scripts/local_slurm.sh env)")
#
# Needs: Debian or Ubuntu, root, no systemd required. Everything generated (slurm.conf, munge key and socket,
# pid files, logs, spool) lives under one directory, $CN_SLURM_DIR (default /tmp/cn-slurm); outside it only
# the apt install touches the system. Nothing is written to /etc/slurm: every Slurm command and daemon reads
# $SLURM_CONF, so clients must have `export SLURM_CONF=$CN_SLURM_DIR/slurm.conf` (the tests set it themselves
# when $CN_SLURM_DIR/slurm.conf exists). Jobs inherit it from sbatch (--export=ALL is the default).
#
# Environment knobs:
#   CN_SLURM_DIR          state directory (default /tmp/cn-slurm)
#   CN_SLURM_WAIT_S       how long `start` waits for the node to become idle (default 60)
#   CN_SLURM_CTLD_PORT    slurmctld port (default 6817); slurmd uses the next one
set -euo pipefail

STATE_DIR="${CN_SLURM_DIR:-/tmp/cn-slurm}"
WAIT_S="${CN_SLURM_WAIT_S:-60}"
CTLD_PORT="${CN_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT=$((CTLD_PORT + 1))
CONF="$STATE_DIR/slurm.conf"
MUNGE_DIR="$STATE_DIR/munge"
RUN_DIR="$STATE_DIR/run"
LOG_DIR="$STATE_DIR/log"
SPOOL_DIR="$STATE_DIR/spool"
# The order daemons start in; `stop` walks it backwards.
DAEMONS=(munged slurmctld slurmd)
APT_PACKAGES=(slurmctld slurmd slurm-client munge)

export SLURM_CONF="$CONF"
# Daemons live in sbin, which non-login root shells may lack on PATH.
export PATH="$PATH:/usr/sbin:/sbin"

# Daemons this `start` launched; a failing `start` stops them again, so a failure leaves nothing behind.
STARTED_NOW=()

log() { echo "local_slurm: $*" >&2; }
die() {
    log "ERROR: $*"
    local idx
    for ((idx = ${#STARTED_NOW[@]} - 1; idx >= 0; idx--)); do
        stop_daemon "${STARTED_NOW[idx]}"
    done
    exit 1
}

pid_file() { echo "$RUN_DIR/$1.pid"; }

# The pid in the daemon's pid file, if that process is alive and really is that daemon (pids get reused).
running_pid() {
    local file pid
    file="$(pid_file "$1")"
    [[ -s "$file" ]] || return 1
    pid="$(tr -dc '0-9' <"$file")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$1" || return 1
    echo "$pid"
}

have_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
        && command -v munged >/dev/null
}

install_packages() {
    if have_packages; then
        return 0
    fi
    [[ -r /etc/debian_version ]] || die "Slurm is not installed and this is not Debian/Ubuntu; install" \
        "slurmctld, slurmd, slurm-client and munge yourself"
    command -v apt-get >/dev/null || die "apt-get not found; cannot install ${APT_PACKAGES[*]}"
    # Debian's maintainer scripts start services on install; we start the daemons ourselves with our own
    # config, so a policy-rc.d that answers 101 ("action forbidden") blocks that. One already there (Docker
    # images ship one) is left as it is.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\n# scripts/local_slurm.sh: no service starts during apt-get\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT # also when interrupted
    fi
    log "installing ${APT_PACKAGES[*]} with apt-get"
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}" >"$LOG_DIR/apt.log" 2>&1; then
        # Usually stale or missing package lists; refresh once and retry.
        log "apt-get install failed; running apt-get update and retrying"
        { apt-get update -q && apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"; } \
            >>"$LOG_DIR/apt.log" 2>&1 || rc=$?
    fi
    if ((created_policy)); then
        rm -f "$policy"
        trap - EXIT
    fi
    if ((rc != 0)) || ! have_packages; then
        tail -n 20 "$LOG_DIR/apt.log" >&2 || true
        die "could not install ${APT_PACKAGES[*]} (full log: $LOG_DIR/apt.log)"
    fi
}

write_munge_key() {
    local key="$MUNGE_DIR/munge.key"
    [[ -s "$key" ]] && return 0
    # munged refuses keys that others can read.
    (umask 077 && dd if=/dev/urandom of="$key" bs=1024 count=1 status=none)
}

write_conf() {
    local host node_line cpus real_mem def_mem
    host="$(hostname -s)"
    # slurmd -C prints this machine's NodeName line (CPUs, sockets, cores, threads, RealMemory) as slurmd
    # itself will detect it, so the node never gets drained for a mismatch.
    node_line="$(slurmd -C 2>/dev/null | grep -m1 '^NodeName=')" || die "'slurmd -C' printed no NodeName line"
    node_line="$(sed -E 's/^NodeName=[^ ]+ //' <<<"$node_line")"
    cpus="$(grep -oE '(^| )CPUs=[0-9]+' <<<"$node_line" | cut -d= -f2)"
    real_mem="$(grep -oE 'RealMemory=[0-9]+' <<<"$node_line" | cut -d= -f2)"
    [[ -n "$cpus" && -n "$real_mem" ]] || die "could not read CPUs/RealMemory from 'slurmd -C': $node_line"
    # A job that asks for no memory gets DefMemPerCPU per CPU; an equal share of the node's memory lets
    # as many one-CPU jobs run side by side as there are CPUs.
    def_mem=$((real_mem / cpus))
    cat >"$CONF.tmp" <<EOF
# Generated by scripts/local_slurm.sh; rewritten on every start. One node, no accounting.
ClusterName=cn-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# Everything runs as root here: no slurm user, no privilege drop needed for a test cluster.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged socket, so the system munge (if any) is left alone.
AuthInfo=socket=$MUNGE_DIR/munge.socket
StateSaveLocation=$SPOOL_DIR/slurmctld
SlurmdSpoolDir=$SPOOL_DIR/slurmd
SlurmctldPidFile=$(pid_file slurmctld)
SlurmdPidFile=$(pid_file slurmd)
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups (containers and machines without systemd rarely have a usable cgroup tree).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
# Jobs share the node: cores and memory are the consumable resources.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$def_mem
# Without accounting, sacct cannot answer; canonical_network.utils.slurm falls back to scontrol, which only
# knows jobs for MinJobAge seconds after they end. 600 s leaves time to read final states.
MinJobAge=600
# Seconds between SIGTERM and SIGKILL on cancel/timeout; short, so tests that scancel finish quickly.
KillWait=5
# Nothing to mail from here; the default (/bin/mail) is usually missing and only logs an error.
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 $node_line State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
}

start_daemon() {
    local name="$1" pid
    if pid="$(running_pid "$name")"; then
        log "$name already running (pid $pid)"
        return 0
    fi
    rm -f "$(pid_file "$name")"
    case "$name" in
        munged)
            munged --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_DIR/munge.socket" \
                --pid-file="$(pid_file munged)" --log-file="$LOG_DIR/munged.log" \
                --seed-file="$MUNGE_DIR/munged.seed" >>"$LOG_DIR/munged.out" 2>&1 \
                || die "munged failed to start; see $LOG_DIR/munged.log and $LOG_DIR/munged.out"
            ;;
        slurmctld | slurmd)
            # Both daemonize and write their pid file (paths from slurm.conf).
            "$name" -f "$CONF" >>"$LOG_DIR/$name.out" 2>&1 \
                || die "$name failed to start; see $LOG_DIR/$name.log and $LOG_DIR/$name.out"
            ;;
    esac
    local i
    for i in $(seq 1 50); do
        if pid="$(running_pid "$name")"; then
            log "started $name (pid $pid)"
            STARTED_NOW+=("$name")
            return 0
        fi
        sleep 0.2
    done
    tail -n 20 "$LOG_DIR/$name.log" >&2 2>/dev/null || true
    die "$name did not come up within 10 s; see $LOG_DIR/$name.log"
}

node_state() { sinfo -h -N -n "$(hostname -s)" -o '%t' 2>/dev/null | head -n1; }

wait_idle() {
    local deadline=$((SECONDS + WAIT_S)) state="" d
    while ((SECONDS < deadline)); do
        # A daemon that exits right after daemonizing (port in use, bad config) says why in its log.
        for d in "${DAEMONS[@]}"; do
            if ! running_pid "$d" >/dev/null; then
                grep -hE 'fatal|error' "$LOG_DIR/$d.log" 2>/dev/null | grep -v 'pmix\|MPI' | tail -n 3 >&2
                die "$d exited during start-up; see $LOG_DIR/$d.log"
            fi
        done
        state="$(node_state || true)"
        # idle, or mix/alloc when jobs from before a restart are already running again
        case "$state" in
            idle | mix | alloc) return 0 ;;
        esac
        sleep 0.5
    done
    sinfo -R >&2 2>/dev/null || true
    tail -n 15 "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" >&2 2>/dev/null || true
    die "node did not become idle within $WAIT_S s (last state: '${state:-no answer from slurmctld}')"
}

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do
        running_pid "$d" >/dev/null || return 1
    done
}

cmd_start() {
    [[ "$(id -u)" == 0 ]] || die "must run as root (it installs packages and runs slurmd, which runs jobs)"
    if all_running && [[ "$(node_state || true)" =~ ^(idle|mix|alloc)$ ]]; then
        log "already running (state dir $STATE_DIR); nothing to do"
        echo "export SLURM_CONF=$CONF"
        return 0
    fi
    local t0=$SECONDS start_ns
    mkdir -p "$STATE_DIR" "$RUN_DIR" "$LOG_DIR" "$SPOOL_DIR/slurmctld" "$SPOOL_DIR/slurmd"
    mkdir -p "$MUNGE_DIR"
    # munged insists that only root can write to the directories holding its key, socket and log, and that
    # everyone can reach the socket (the key itself is 0600).
    chmod 0755 "$STATE_DIR" "$RUN_DIR" "$LOG_DIR" "$MUNGE_DIR"
    install_packages
    local install_s=$((SECONDS - t0))
    start_ns="$(date +%s%N)"
    write_munge_key
    if ! running_pid slurmctld >/dev/null; then
        write_conf # only when slurmctld is down: a running controller keeps the config it read
    fi
    local d
    for d in "${DAEMONS[@]}"; do
        start_daemon "$d"
    done
    wait_idle
    local up_ms=$((($(date +%s%N) - start_ns) / 1000000))
    log "cluster up: node $(hostname -s) idle after $((up_ms / 1000)).$(printf '%03d' $((up_ms % 1000))) s" \
        "(install/check: ${install_s} s); state dir $STATE_DIR"
    echo "export SLURM_CONF=$CONF"
}

# Ends the process behind a pid file: SIGTERM, then SIGKILL after 15 s.
stop_daemon() {
    local name="$1" pid i
    if ! pid="$(running_pid "$name")"; then
        rm -f "$(pid_file "$name")"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 75); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name (pid $pid) ignored SIGTERM for 15 s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$(pid_file "$name")"
    log "stopped $name (pid $pid)"
}

cmd_stop() {
    [[ -d "$STATE_DIR" ]] || {
        log "nothing to stop ($STATE_DIR does not exist)"
        return 0
    }
    # Jobs still running would leave slurmstepd and their processes behind once slurmd is gone:
    # cancel them first and give them KillWait (5 s) plus a margin to end.
    if running_pid slurmctld >/dev/null; then
        local jobs i
        jobs="$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')"
        if [[ -n "${jobs// /}" ]]; then
            log "cancelling jobs: $jobs"
            # shellcheck disable=SC2086  # one job id per word
            scancel $jobs 2>/dev/null || true
            for i in $(seq 1 30); do
                [[ -z "$(squeue -h -t R,CG,S -o '%A' 2>/dev/null)" ]] && break
                sleep 0.5
            done
        fi
    fi
    local d any=0
    for d in "${DAEMONS[@]}"; do
        running_pid "$d" >/dev/null && any=1
    done
    if ((any == 0)); then
        log "not running; nothing to stop"
        return 0
    fi
    local idx
    for ((idx = ${#DAEMONS[@]} - 1; idx >= 0; idx--)); do
        stop_daemon "${DAEMONS[idx]}"
    done
    log "stopped (state, logs and config kept in $STATE_DIR)"
}

cmd_status() {
    local d pid rc=0
    for d in "${DAEMONS[@]}"; do
        if pid="$(running_pid "$d")"; then
            echo "$d: running (pid $pid)"
        else
            echo "$d: stopped"
            rc=3
        fi
    done
    if ((rc == 0)); then
        sinfo -N -l 2>/dev/null || rc=3
        echo "export SLURM_CONF=$CONF"
    fi
    return "$rc"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *)
        echo "usage: $0 start|stop|status|env   (state dir: \$CN_SLURM_DIR, default /tmp/cn-slurm)" >&2
        exit 2
        ;;
esac
