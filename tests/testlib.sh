# Shared by the shell tests: counting checks, the closing "N passed, N failed" line, and the one
# way they launch ranks with mpirun.
pass=0
fails=0
ok() { pass=$((pass + 1)); }
bad() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
summary() {
  echo "$pass passed, $fails failed"
  [ "$fails" -eq 0 ]
}

# mpirun as every test launches ranks on this one machine: --allow-run-as-root (CI's containers
# run as root), --oversubscribe (more ranks than cores: CI has 2) and --bind-to none (the ranks of
# tests running at once would otherwise be pinned to the same cores and starve each other).
#   mpi_run -np 2 BIN ARGS...                   a launch
#   timeout 60 "${mpirun_local[@]}" -np 2 ...   the same words, for a command that runs its
#                                               arguments (timeout, env), which a function cannot be
mpirun_local=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
mpi_run() { "${mpirun_local[@]}" "$@"; }

# The three tools in BINDIR ($train, $export_bin, $gen) and a scratch folder $work, removed at exit
# with any job still in the background.
use_tools() {  # use_tools BINDIR
  train="$1/fsdp-train"
  export_bin="$1/fsdp-export"
  gen="$1/fsdp-generate"
  work=$(mktemp -d)
  trap 'kill $(jobs -p) 2> /dev/null; rm -rf "$work"' EXIT
}
