#!/usr/bin/env bash
# deploy on damaged copies of hybrid_mlp's export (run in the directory that
# holds it): each must exit 1 with the loader's message, which names the file
# and the byte offset of the damage.
set -uo pipefail
deploy=$1
check() {  # check NAME SYMBOL PARAMS REGEX
  local out
  out=$("$deploy" "$2" "$3" 2>&1)
  local status=$?
  if [[ $status -ne 1 ]] || ! grep -Eq "$4" <<<"$out"; then
    echo "FAIL $1: exit $status, output: $out"
    return 1
  fi
  echo "ok   $1: $out"
}
head -c 300 my_mlp-0000.params >truncated.params
printf 'not a params file at all' >garbage.params
head -c 200 my_mlp-symbol.json >truncated-symbol.json
status=0
check "truncated params" my_mlp-symbol.json truncated.params "truncated\.params.*offset" || status=1
check "wrong magic" my_mlp-symbol.json garbage.params "garbage\.params.*offset" || status=1
check "truncated graph" truncated-symbol.json my_mlp-0000.params "truncated-symbol\.json.*offset" || status=1
check "missing file" missing-symbol.json my_mlp-0000.params "missing-symbol\.json" || status=1
exit $status
