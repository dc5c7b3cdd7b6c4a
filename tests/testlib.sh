# Shared by the shell tests: counting checks and the closing "N passed, N failed" line.
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
