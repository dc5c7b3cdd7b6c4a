#!/usr/bin/env bash
# Launch and rendezvous, each failure a clear error within the time-out:
# scripts/fsdprun's prefixes and failure propagation; a missing rank, a wrong
# MASTER_PORT, an unreachable MASTER_ADDR, a port in use, an inconsistent
# WORLD_SIZE, a bad RANK, and a rank that dies in the middle of a collective
# (Gloo and MPI).
set -uo pipefail
probe=$1
fsdprun=$2
work=$(mktemp -d)
trap 'kill $(jobs -p) 2> /dev/null; rm -rf "$work"' EXIT
source "$(dirname "$0")/testlib.sh"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export FSDP_STORE_TIMEOUT_S=3 FSDP_COLLECTIVE_TIMEOUT_S=5 OMP_NUM_THREADS=1
unset OMPI_COMM_WORLD_SIZE RANK WORLD_SIZE FSDP_BACKEND

# expect_error NAME NEEDLE LOGFILE STATUS: a non-zero status that is not a time-out, and the needle in the log.
expect_error() {
  local name=$1 needle=$2 log=$3 status=$4
  if [ "$status" -eq 0 ]; then bad "$name: succeeded, expected an error"
  elif [ "$status" -eq 124 ]; then bad "$name: hung until the test's own time-out"
  elif ! grep -qF -- "$needle" "$log"; then bad "$name: no '$needle' in: $(cat "$log")"
  else ok; fi
}

# 1. fsdprun: torchrun's environment, prefixed output, success.
timeout 60 "$fsdprun" --standalone --nproc_per_node 3 "$probe" > "$work/ok.out" 2>&1
st=$?
[ $st -eq 0 ] && ok || bad "fsdprun 3 ranks exited $st: $(cat "$work/ok.out")"
for r in 0 1 2; do
  grep -q "^\[rank$r\]:probe ok: rank $r of 3 (gloo, launcher torchrun) sum 3" "$work/ok.out" && ok || bad "no prefixed line from rank $r"
done

# 2. fsdprun: one rank fails -> the others are ended, fsdprun exits with that status.
start=$(date +%s)
timeout 60 "$fsdprun" --standalone --nproc_per_node 3 bash -c '[ "$RANK" = 1 ] && exit 7; sleep 50' > "$work/fail.out" 2>&1
st=$?
[ $st -eq 7 ] && ok || bad "fsdprun exit status $st, expected 7"
[ $(($(date +%s) - start)) -lt 30 ] && ok || bad "fsdprun did not end the other ranks promptly"
grep -q "rank 1 failed with exit code 7" "$work/fail.out" && ok || bad "fsdprun did not name the failed rank: $(cat "$work/fail.out")"
timeout 10 "$fsdprun" --nproc_per_node 0 "$probe" > "$work/badflag.out" 2>&1
expect_error "fsdprun --nproc_per_node 0" "must be >= 1" "$work/badflag.out" $?

# 3. A rank that never arrives.
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/missing.out" 2>&1
expect_error "missing rank" "only 1 of 2 ranks arrived" "$work/missing.out" $?
grep -qF "missing rank(s): 1" "$work/missing.out" && ok || bad "missing rank not named"

# 4. A wrong MASTER_PORT on rank 1: rank 1 cannot reach the store, rank 0 misses rank 1.
port=$(free_port)
wrong=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/r0.out" 2>&1 &
pid0=$!
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$wrong timeout 30 "$probe" > "$work/r1.out" 2>&1
st1=$?
wait $pid0
st0=$?
expect_error "wrong MASTER_PORT (rank 1)" "cannot reach the store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:$wrong" "$work/r1.out" $st1
expect_error "wrong MASTER_PORT (rank 0)" "only 1 of 2 ranks arrived" "$work/r0.out" $st0

# 5. An unreachable MASTER_ADDR.
RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=29999 timeout 30 "$probe" > "$work/addr.out" 2>&1
expect_error "unreachable MASTER_ADDR" "no-such-host.invalid:29999" "$work/addr.out" $?

# 6. A port already in use.
port=$(free_port)
python3 -c "import socket,time; s=socket.socket(); s.bind(('0.0.0.0', $port)); s.listen(); open('$work/held','w').close(); time.sleep(30)" &
holder=$!
for _ in $(seq 100); do [ -f "$work/held" ] && break; sleep 0.1; done
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/inuse.out" 2>&1
expect_error "port in use" "cannot serve on port $port: Address already in use" "$work/inuse.out" $?
kill $holder 2> /dev/null

# 7. Ranks that disagree on WORLD_SIZE.
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/ws0.out" 2>&1 &
pid0=$!
RANK=1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/ws1.out" 2>&1
st1=$?
wait $pid0
st0=$?
expect_error "inconsistent WORLD_SIZE (rank 0)" "rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2" "$work/ws0.out" $st0
expect_error "inconsistent WORLD_SIZE (rank 1)" "rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2" "$work/ws1.out" $st1

# 8. Bad values in the environment.
RANK=2 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 timeout 10 "$probe" > "$work/rank.out" 2>&1
expect_error "RANK out of range" "RANK=2 is not in [0, WORLD_SIZE=2)" "$work/rank.out" $?
RANK=0 WORLD_SIZE=two MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 timeout 10 "$probe" > "$work/ws.out" 2>&1
expect_error "WORLD_SIZE not a number" "WORLD_SIZE='two' is not an integer" "$work/ws.out" $?
FSDP_BACKEND=carrier-pigeon timeout 10 "$probe" > "$work/be.out" 2>&1
expect_error "unknown backend" "FSDP_BACKEND='carrier-pigeon'" "$work/be.out" $?

# 9. A world of one without a launcher.
timeout 10 "$probe" > "$work/one.out" 2>&1 && grep -q "probe ok: rank 0 of 1 (local, launcher none) sum 1" "$work/one.out" \
  && ok || bad "world of one: $(cat "$work/one.out")"

# 10. A rank dies in the middle of the job: the other gets an error, not a hang.
port=$(free_port)
FSDP_PROBE_DIE_RANK=1 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/d0.out" 2>&1 &
pid0=$!
FSDP_PROBE_DIE_RANK=1 RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 30 "$probe" > "$work/d1.out" 2>&1
wait $pid0
expect_error "dead peer (gloo)" "all_reduce" "$work/d0.out" $?
if command -v mpirun > /dev/null; then
  FSDP_PROBE_DIE_RANK=1 timeout 60 "${mpirun_local[@]}" -np 2 "$probe" > "$work/mpi.out" 2>&1
  st=$?
  [ $st -ne 0 ] && [ $st -ne 124 ] && ok || bad "dead peer (mpi): status $st"
fi

summary
