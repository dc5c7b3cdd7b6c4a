#!/usr/bin/env bash
# fsdp-train under a real Slurm: Debian's slurm-wlm (slurmctld, slurmd) and munge, started by this
# test as a one-node cluster on loopback and stopped by it, whatever happens.
#   - `srun -n 2 fsdp-train` and `sbatch examples/slurm/train.sbatch` train to the losses of
#     `mpirun -np 2`, bit for bit (grad norms too);
#   - an srun step names itself in the config table (launcher slurm, 2 ranks); under
#     srun --mpi=pmix the MPI engine runs, to the same losses;
#   - a Slurm-like environment of 2 tasks with no node list, or WORLD_SIZE=2 without MASTER_ADDR,
#     is refused by name at once (these two run without Slurm too).
#   slurm_test.sh FSDP_TRAIN
set -uo pipefail
train=$1
root=$(cd "$(dirname "$0")/.." && pwd)
source "$(dirname "$0")/testlib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d /tmp/fsdp-slurm.XXXXXX)
small=(--preset tiny --arch llama --dim 32 --layers 2 --heads 4 --vocab 256 --seq 16 --batch 2 --threads 1
  --steps 4 --sample-tokens 0)

# Losses and grad norms of the step lines (the timing fields differ run to run).
losses() { grep -E '^step [0-9]+ \|' "$1" | sed -E 's/\| [0-9]+ tok\/s \| mfu [0-9.]+% \| peak mem [0-9.]+ GB //; s/ \| elapsed [0-9hms]+ \| eta [0-9hms]+$//'; }

# 1. No way to meet: refused by name, before any wait.
refuse() {  # refuse NAME NEEDLE ENV...
  local name=$1 needle=$2
  shift 2
  if env -u OMPI_COMM_WORLD_SIZE -u RANK -u WORLD_SIZE "$@" timeout 60 "$train" "${small[@]}" > "$work/refuse.out" 2>&1; then
    bad "$name: accepted"
  elif ! grep -qF -- "$needle" "$work/refuse.out"; then
    bad "$name: no '$needle' in: $(tail -2 "$work/refuse.out")"
  else ok; fi
}
refuse "2 Slurm tasks without a node list" "a Slurm step of 2 tasks" SLURM_PROCID=0 SLURM_NTASKS=2
refuse "WORLD_SIZE=2 without MASTER_ADDR" "MASTER_ADDR is not set" RANK=0 WORLD_SIZE=2 MASTER_PORT=29999

# The reference: mpirun -np 2.
mpi_run -np 2 "$train" "${small[@]}" > "$work/mpirun.out" 2>&1 \
  || bad "mpirun -np 2: $(tail -3 "$work/mpirun.out")"
losses "$work/mpirun.out" > "$work/mpirun.losses"
[ "$(wc -l < "$work/mpirun.losses")" -eq 4 ] || bad "mpirun -np 2 printed $(wc -l < "$work/mpirun.losses") step lines"

for t in munged slurmctld slurmd srun sbatch sinfo scontrol; do
  if ! command -v $t > /dev/null; then
    echo "skipped: $t is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
    rm -rf "$work"
    summary
    exit $?
  fi
done

# 2. A one-node cluster on loopback: munge with its own key and socket, slurmctld and slurmd on
# free ports, everything under $work.
cleanup() {
  [ -n "${SLURM_CONF:-}" ] && scontrol shutdown > /dev/null 2>&1
  for p in slurmd slurmctld munged; do
    [ -f "$work/$p.pid" ] && kill "$(cat "$work/$p.pid")" 2> /dev/null
  done
  sleep 1
  for p in slurmd slurmctld munged; do
    [ -f "$work/$p.pid" ] && kill -9 "$(cat "$work/$p.pid")" 2> /dev/null
  done
  pkill -9 -f "$work" 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/state" "$work/spool" "$work/log"
head -c 1024 /dev/urandom > "$work/munge.key"
chmod 400 "$work/munge.key"
munged --force --socket="$work/munge.sock" --key-file="$work/munge.key" --pid-file="$work/munged.pid" \
  --log-file="$work/log/munged.log" --seed-file="$work/munged.seed" \
  || { bad "munged did not start: $(tail -3 "$work/log/munged.log")"; summary; exit 1; }
read -r ctld_port d_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
cat > "$work/slurm.conf" << EOF
ClusterName=fsdptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge.sock
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig=/dev/null
NodeName=localhost NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$(getconf _NPROCESSORS_ONLN) RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF" || bad "slurmctld did not start: $(tail -3 "$work/log/slurmctld.log")"
slurmd -f "$SLURM_CONF" || bad "slurmd did not start: $(tail -3 "$work/log/slurmd.log")"
state=""
for _ in $(seq 600); do  # the node registers: at most 60 s
  state=$(sinfo -h -o %T 2> /dev/null)
  [ "$state" = idle ] && break
  sleep 0.1
done
if [ "$state" != idle ]; then
  bad "the one-node cluster did not come up (node state '$state'): $(tail -3 "$work/log/slurmctld.log")"
  summary
  exit 1
fi

# 3. srun -n 2: the same losses as mpirun -np 2, and the step says it is Slurm's.
timeout 300 srun -n 2 --overcommit --kill-on-bad-exit=1 "$train" "${small[@]}" > "$work/srun.out" 2>&1 \
  || bad "srun -n 2: $(tail -3 "$work/srun.out")"
losses "$work/srun.out" > "$work/srun.losses"
cmp -s "$work/mpirun.losses" "$work/srun.losses" && [ -s "$work/srun.losses" ] && ok \
  || bad "srun -n 2 losses differ from mpirun -np 2: $(diff "$work/mpirun.losses" "$work/srun.losses" | head -4)"
grep -qE 'world size +\| 2 .*slurm' "$work/srun.out" && ok \
  || bad "srun -n 2 did not run as a Slurm world of 2: $(grep -m1 'world size' "$work/srun.out")"

# 3b. srun --mpi=pmix: Open MPI meets through Slurm's PMIx, the MPI engine carries the collectives.
if srun --mpi=list 2>&1 | grep -q pmix; then
  timeout 300 srun --mpi=pmix -n 2 --overcommit --kill-on-bad-exit=1 "$train" "${small[@]}" > "$work/pmix.out" 2>&1 \
    || bad "srun --mpi=pmix -n 2: $(tail -3 "$work/pmix.out")"
  losses "$work/pmix.out" > "$work/pmix.losses"
  cmp -s "$work/mpirun.losses" "$work/pmix.losses" && [ -s "$work/pmix.losses" ] && ok \
    || bad "srun --mpi=pmix losses differ from mpirun -np 2: $(diff "$work/mpirun.losses" "$work/pmix.losses" | head -4)"
  grep -qE 'world size +\| 2 .*mpi' "$work/pmix.out" && ok \
    || bad "srun --mpi=pmix did not run the MPI engine: $(grep -m1 'world size' "$work/pmix.out")"
else
  echo "srun has no pmix plugin here: srun --mpi=pmix not tested"
fi

# 4. sbatch of the example script: the same losses.
FSDP_TRAIN=$train timeout 300 sbatch --wait --overcommit -o "$work/sbatch.out" -D "$work" \
  "$root/examples/slurm/train.sbatch" "${small[@]}" > "$work/sbatch.submit" 2>&1 \
  || bad "sbatch --wait: $(cat "$work/sbatch.submit") $(tail -3 "$work/sbatch.out" 2> /dev/null)"
losses "$work/sbatch.out" > "$work/sbatch.losses"
cmp -s "$work/mpirun.losses" "$work/sbatch.losses" && [ -s "$work/sbatch.losses" ] && ok \
  || bad "sbatch losses differ from mpirun -np 2: $(diff "$work/mpirun.losses" "$work/sbatch.losses" | head -4)"

summary
