#!/usr/bin/env bash
# Several nodes on one machine: two network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2, addresses that exist only inside the namespaces this test makes), each a node with
# 2 ranks under fsdprun --nnodes 2. Every packet stays inside those namespaces; the test removes
# them whatever happens.
#   - under fsdprun and under mpirun (a hostfile of the two addresses; Open MPI's remote-shell agent
#     enters the other namespace, as ssh would reach another host), the losses equal 4 ranks on
#     one host, bit for bit;
#   - a checkpoint saved by the two nodes resumes on one host, bit-exact;
#   - kill -9 of one node's ranks ends the other node's ranks with an error that names the lost
#     ranks ("late: rank 2 ..."), within the collective time-out;
#   - an unreachable MASTER_ADDR and a wrong GLOO_SOCKET_IFNAME are errors that name the value.
#   multinode_test.sh FSDP_TRAIN FSDPRUN
set -uo pipefail
train=$1
fsdprun=$2
source "$(dirname "$0")/testlib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE FSDP_STORE_TIMEOUT_S=60
if [ "$(id -u)" -ne 0 ] || ! ip netns list > /dev/null 2>&1; then
  echo "skipped: network namespaces need root and iproute2 (ip netns)"
  exit 0
fi
work=$(mktemp -d)
tag=$$
ns=(fsdp-n0-$tag fsdp-n1-$tag)
addr=(10.77.0.1 10.77.0.2)
cleanup() {
  pkill -9 -f "$work" 2> /dev/null
  for n in "${ns[@]}"; do ip netns pids "$n" 2> /dev/null | xargs -r kill -9 2> /dev/null; done
  for n in "${ns[@]}"; do ip netns del "$n" 2> /dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
for n in "${ns[@]}"; do ip netns add "$n" || { bad "ip netns add $n"; summary; exit 1; }; done
ip link add "fv0-$tag" netns "${ns[0]}" type veth peer name "fv1-$tag" netns "${ns[1]}" \
  || { bad "could not make the veth pair"; summary; exit 1; }
for i in 0 1; do
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "fv$i-$tag"
  ip -n "${ns[$i]}" link set "fv$i-$tag" up
  ip -n "${ns[$i]}" link set lo up
done

small=(--preset tiny --arch llama --dim 32 --layers 2 --heads 4 --vocab 256 --seq 16 --batch 4 --threads 1
  --sample-tokens 0)
losses() { grep -E '^(\[rank0\]:)?step [0-9]+ \|' "$1" | sed -E 's/^\[rank0\]://; s/\| [0-9]+ tok\/s \| mfu [0-9.]+% \| peak mem [0-9.]+ GB //; s/ \| elapsed [0-9hms]+ \| eta [0-9hms]+$//'; }
# node K ARGS...: fsdprun for node K in its namespace, in the background; its pid in $node_pid.
node() {
  local k=$1
  shift
  ip netns exec "${ns[$k]}" python3 "$fsdprun" --nnodes 2 --node_rank "$k" --nproc_per_node 2 \
    --master_addr "${addr[0]}" --master_port 29411 --rdzv-id "mn-$tag-$run" "$train" "$@" \
    > "$work/$run.node$k.out" 2>&1 &
  node_pid=$!
}

# 1. The reference: 4 ranks on one host.
python3 "$fsdprun" --standalone --nproc_per_node 4 "$train" "${small[@]}" --steps 4 > "$work/one.out" 2>&1 \
  || bad "4 ranks on one host: $(tail -3 "$work/one.out")"
losses "$work/one.out" > "$work/one.losses"
[ "$(wc -l < "$work/one.losses")" -eq 4 ] || bad "4 ranks on one host printed $(wc -l < "$work/one.losses") steps"

# 2. Two nodes x 2 ranks: the same losses; a checkpoint at step 2 written by both nodes.
run=train
node 0 "${small[@]}" --steps 4 --ckpt-dir "$work/ckpt" --ckpt-every 2
p0=$node_pid
node 1 "${small[@]}" --steps 4 --ckpt-dir "$work/ckpt" --ckpt-every 2
p1=$node_pid
wait $p0
rc0=$?
wait $p1
rc1=$?
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && ok || bad "two nodes: rc $rc0 and $rc1: $(grep -h -m2 -i error "$work"/train.node*.out)"
losses "$work/train.node0.out" > "$work/two.losses"
cmp -s "$work/one.losses" "$work/two.losses" && [ -s "$work/two.losses" ] && ok \
  || bad "two nodes' losses differ from one host's: $(diff "$work/one.losses" "$work/two.losses" | head -4)"
grep -q "world size.*| 4 " "$work/train.node0.out" && ok || bad "node 0 did not see a world of 4"

# 3. Resume on one host from the two nodes' step-2 checkpoint: steps 2 and 3 as before.
rm -rf "$work/ckpt/step_00000004"
python3 "$fsdprun" --standalone --nproc_per_node 4 "$train" "${small[@]}" --steps 4 --ckpt-dir "$work/ckpt" \
  --resume > "$work/resume.out" 2>&1 || bad "resume on one host: $(tail -3 "$work/resume.out")"
losses "$work/resume.out" > "$work/resume.losses"
tail -2 "$work/one.losses" | cmp -s - "$work/resume.losses" && ok \
  || bad "the resumed steps differ: $(diff <(tail -2 "$work/one.losses") "$work/resume.losses" | head -4)"

# 3b. The same under mpirun: started in node 0's namespace with a hostfile of the two addresses;
# Open MPI's remote-shell agent is a script that enters the host's namespace (on a real cluster it
# is ssh), and MPI's traffic takes TCP over the veth pair, as between two hosts.
cat > "$work/agent.sh" << AGENT
#!/bin/sh
# Open MPI's plm_rsh_agent: "agent HOST COMMAND": COMMAND in HOST's namespace.
host=\$1
shift
case "\$host" in
  ${addr[0]}) ns=${ns[0]} ;;
  ${addr[1]}) ns=${ns[1]} ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$work/agent.sh"
printf '%s slots=2\n%s slots=2\n' "${addr[0]}" "${addr[1]}" > "$work/hosts"
mpi=("${mpirun_local[@]}")
mpi_nodes=("${mpi[@]}" -np 4 --hostfile "$work/hosts" --mca plm_rsh_agent "$work/agent.sh" --mca btl tcp,self
  --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
"${mpi[@]}" -np 4 "$train" "${small[@]}" --steps 4 > "$work/mpi_one.out" 2>&1 \
  || bad "mpirun -np 4 on one host: $(tail -3 "$work/mpi_one.out")"
losses "$work/mpi_one.out" > "$work/mpi_one.losses"
timeout 300 ip netns exec "${ns[0]}" "${mpi_nodes[@]}" "$train" "${small[@]}" --steps 4 --ckpt-dir "$work/mpickpt" \
  --ckpt-every 2 > "$work/mpi_two.out" 2>&1 || bad "mpirun over two nodes: $(tail -3 "$work/mpi_two.out")"
losses "$work/mpi_two.out" > "$work/mpi_two.losses"
cmp -s "$work/mpi_one.losses" "$work/mpi_two.losses" && [ "$(wc -l < "$work/mpi_two.losses")" -eq 4 ] && ok \
  || bad "mpirun over two nodes: losses differ from one host's: $(diff "$work/mpi_one.losses" "$work/mpi_two.losses" | head -4)"
rm -rf "$work/mpickpt/step_00000004"
"${mpi[@]}" -np 4 "$train" "${small[@]}" --steps 4 --ckpt-dir "$work/mpickpt" --resume > "$work/mpi_resume.out" 2>&1 \
  || bad "resume on one host (mpirun): $(tail -3 "$work/mpi_resume.out")"
losses "$work/mpi_resume.out" > "$work/mpi_resume.losses"
tail -2 "$work/mpi_one.losses" | cmp -s - "$work/mpi_resume.losses" && ok \
  || bad "the resumed steps differ (mpirun): $(diff <(tail -2 "$work/mpi_one.losses") "$work/mpi_resume.losses" | head -4)"

# 4. kill -9 of node 1's ranks: node 0's ranks end, naming the peer they lost, within the time-out.
run=kill
export FSDP_COLLECTIVE_TIMEOUT_S=10
node 0 "${small[@]}" --steps 1000000 --log-file "$work/kill.jsonl"
p0=$node_pid
node 1 "${small[@]}" --steps 1000000 --log-file "$work/kill.jsonl"  # the same command line (rank 0 writes it)
p1=$node_pid
for _ in $(seq 600); do [ -s "$work/kill.jsonl" ] && break; sleep 0.1; done
ip netns pids "${ns[1]}" | xargs -r kill -9
t0=$(date +%s)
timeout 120 tail --pid=$p0 -f /dev/null
took=$(($(date +%s) - t0))
wait $p0
rc0=$?
wait $p1 2> /dev/null
unset FSDP_COLLECTIVE_TIMEOUT_S
[ -s "$work/kill.jsonl" ] && [ $rc0 -ne 0 ] && [ $took -le 70 ] \
  && grep -qE 'late: rank [23] ' "$work/kill.node0.out" && ok \
  || bad "node 0 after node 1 was killed: rc $rc0 after $took s: $(grep -m2 -iE 'error|late' "$work/kill.node0.out" | cut -c1-300)"

# 4b. The same under mpirun: killing node 1's ranks ends the job on node 0.
timeout 120 ip netns exec "${ns[0]}" "${mpi_nodes[@]}" "$train" "${small[@]}" --steps 1000000 \
  --log-file "$work/mpikill.jsonl" > "$work/mpikill.out" 2>&1 &
job=$!
for _ in $(seq 600); do [ -s "$work/mpikill.jsonl" ] && break; sleep 0.1; done
for p in $(ip netns pids "${ns[1]}"); do
  tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qE '^OMPI_COMM_WORLD_RANK=' && kill -9 "$p"
done
wait $job
rc=$?
[ -s "$work/mpikill.jsonl" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] \
  && grep -qiE 'rank [23]|signal 9|killed' "$work/mpikill.out" && ok \
  || bad "mpirun after node 1's ranks were killed: rc $rc: $(grep -m2 -iE 'error|rank|signal' "$work/mpikill.out" | cut -c1-300)"

# 5. The rendezvous address: unreachable and wrong interface, named.
ip netns exec "${ns[0]}" env RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.78.0.9 MASTER_PORT=29412 FSDP_STORE_TIMEOUT_S=5 \
  timeout 60 "$train" "${small[@]}" --steps 1 > "$work/unreach.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "10.78.0.9" "$work/unreach.out" && ok \
  || bad "an unreachable MASTER_ADDR: rc $rc: $(tail -2 "$work/unreach.out")"
ip netns exec "${ns[0]}" env GLOO_SOCKET_IFNAME=nosuch0 timeout 60 python3 "$fsdprun" --nnodes 1 --nproc_per_node 1 \
  --master_addr "${addr[0]}" --master_port 29413 "$train" "${small[@]}" --steps 1 > "$work/iface.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "GLOO_SOCKET_IFNAME/FSDP_SOCKET_IFNAME='nosuch0'" "$work/iface.out" && ok \
  || bad "a wrong GLOO_SOCKET_IFNAME: rc $rc: $(tail -2 "$work/iface.out")"

summary
