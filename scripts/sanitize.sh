#!/usr/bin/env bash
# The engine under AddressSanitizer + UndefinedBehaviorSanitizer (docs/integrity.md, "The sanitizer
# build"). Not part of CI or scripts/test.sh; run it by hand after changing native/.
#
# Builds the sanitized variant into its own virtualenv (.venv-asan) and build directory (build/asan),
# so the normal .venv and build/{wheel_tag} are untouched, installs nothing outside the checkout, then
# runs the bounded set under the sanitizers:
#   1. pytest tests/test_engine.py tests/test_generate.py tests/test_native_units.py
#             tests/test_integrity.py -m "not slow"
#   2. bmoe-edge gates --quick
#   3. bmoe-edge fuzz --count N (default 200 mutations, each through info and generate)
# plus a canary first (an instrumented overflow that must be caught). Each stage's output and every
# ASan report (a file per process: the fuzz workers' stderr is /dev/null) land in
# build/asan-logs/<time>/; the script prints the reports and exits 1 when there is any or a stage
# fails. A UBSan report ends its process with exit code 98, an ASan report with 99: a fuzz run that
# shows "signal ... ended with 98/99" is a sanitizer report (rerun that file by hand to read it).
#
#   scripts/sanitize.sh                  # engine (native/) instrumented, llama.cpp as usual
#   BMOE_SANITIZE_LLAMA=ON scripts/sanitize.sh   # llama.cpp and ggml too (build/asan-all; a cold
#                                                # build: 23 of 118 steps in 15 min on 2 busy cores)
#   BMOE_SAN_FUZZ_COUNT=50 scripts/sanitize.sh   # a smaller fuzz sample
#   scripts/sanitize.sh --build-only
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

build_only=0
[[ ${1:-} == --build-only ]] && build_only=1
llama=${BMOE_SANITIZE_LLAMA:-OFF}
fuzz_count=${BMOE_SAN_FUZZ_COUNT:-200}
build_dir=build/asan
[[ $llama == ON ]] && build_dir=build/asan-all
venv=${BMOE_SAN_VENV:-.venv-asan}  # BMOE_SAN_VENV: another venv (it gets the sanitized build installed)

asan_rt=$(cc -print-file-name=libasan.so)
[[ -e $asan_rt ]] || { echo "error: no libasan.so for cc (apt-get install libasan8 or gcc)" >&2; exit 1; }
cxx_rt=$(c++ -print-file-name=libstdc++.so)

[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
py=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
$py -m pip install -q cmake ninja 'scikit-build-core>=0.10' 'nanobind>=2.4' 2>&1 | grep -v '^WARNING: Location' || true
$py bmoe_edge/llama_source.py
export CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
echo "building the sanitized variant into $build_dir (llama.cpp instrumented: $llama)"
if ! $py -m pip install -q --no-build-isolation -e '.[host,dev]' \
    -C cmake.define.BMOE_SANITIZE=ON -C "cmake.define.BMOE_SANITIZE_LLAMA=$llama" -C "build-dir=$build_dir" \
    -C cmake.define.BMOE_TEST_FAULTS=ON \
    > "$venv/build.log" 2>&1; then
  grep -v '^WARNING: Location' "$venv/build.log" | tail -40 >&2
  echo "error: the build failed; full log in $venv/build.log" >&2
  exit 1
fi
((build_only)) && exit 0

logs=$root/build/asan-logs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$logs"
# The ASan runtime first in the process (python itself is not instrumented), and libstdc++ with it:
# python does not link it, and ASan resolves its __cxa_throw interceptor at start-up (without it the
# first C++ throw dies with "CHECK failed: real___cxa_throw != 0"). Python's own allocations are not
# ours to chase (detect_leaks=0).
# ASan: a report ends the process with exit code 99 and goes to $logs/asan.<pid> (the fuzz workers'
# stderr is /dev/null). ASan's runtime reads UBSAN_OPTIONS after ASAN_OPTIONS and takes log_path
# from there (stderr when it has none), so both carry it. UBSan: with ASan preloaded, its own runtime
# ignores log_path and writes to stderr, so it halts at the first report with exit code 98 instead
# of recovering. Either code tells
# a sanitizer's exit from the engine's own exit code 1, and fails whatever ran it.
export LD_PRELOAD="$asan_rt $cxx_rt"
export ASAN_OPTIONS="detect_leaks=0:exitcode=99:log_path=$logs/asan:detect_stack_use_after_return=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=98:log_path=$logs/asan:suppressions=$root/scripts/sanitize.supp"

failed=()
stage() {  # name, command...: its output also to $logs/<name>.log
  local name=$1; shift
  echo "== $name: $*"
  local start=$SECONDS rc=0
  "$@" > >(tee "$logs/$name.log") 2>&1 || rc=$?
  wait
  if ((rc == 0)); then echo "== $name: ok ($((SECONDS - start)) s)"
  else echo "== $name: FAILED, exit code $rc ($((SECONDS - start)) s)"; failed+=("$name"); fi
}
# The canary: an instrumented signed overflow and heap overflow, loaded the same way, must be caught
# (else "no reports" below would mean nothing).
canary() {
  local dir=$logs/canary rc=0
  mkdir -p "$dir"
  printf '%s\n' '#include <stdlib.h>' 'int ub(int x) { return x + 0x7fffffff; }' \
    'int oob(int i) { int *p = malloc(4 * sizeof(int)); int v = p[i]; free(p); return v; }' > "$dir/canary.c"
  cc -O1 -g -fsanitize=address,undefined -shared -fPIC "$dir/canary.c" -o "$dir/canary.so"
  local call='import ctypes, sys; print(getattr(ctypes.CDLL(sys.argv[1]), sys.argv[2])(int(sys.argv[3])))'
  "$py" -c "$call" "$dir/canary.so" ub 5 2> "$dir/ub.err" || rc=$?
  ((rc == 98)) && grep -q 'runtime error: signed integer overflow' "$dir/ub.err" || { echo "UBSan missed"; return 1; }
  rc=0
  # UBSan flags the same load first (object size): let it recover here, so ASan's report follows.
  ASAN_OPTIONS="$ASAN_OPTIONS:log_path=$dir/asan" UBSAN_OPTIONS="$UBSAN_OPTIONS:halt_on_error=0:log_path=$dir/asan" \
    "$py" -c "$call" "$dir/canary.so" oob 4 2> /dev/null || rc=$?
  ((rc == 99)) && cat "$dir"/asan.* | grep -q heap-buffer-overflow || { echo "ASan missed"; return 1; }
  echo "both caught (exit codes 98, 99)"
}
stage canary canary
rm -rf "$logs/canary"
# test_small_budget_bounds_resident_expert_bytes measures anonymous RSS, which ASan's quarantine
# (freed blocks held back, 256 MB by default, to catch a use after free) and the fake stacks of
# detect_stack_use_after_return grow: that test runs on its own with both off.
rss_test=tests/test_engine.py::test_small_budget_bounds_resident_expert_bytes
# --capture=tee-sys: pytest captures Python's streams only, so a UBSan report on fd 2 reaches the log.
stage tests "$py" -m pytest -q -p no:cacheprovider --capture=tee-sys -m "not slow" --deselect "$rss_test" \
  tests/test_engine.py tests/test_generate.py tests/test_native_units.py tests/test_integrity.py
ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=0:thread_local_quarantine_size_kb=0:detect_stack_use_after_return=0" \
  stage rss-test "$py" -m pytest -q -p no:cacheprovider --capture=tee-sys "$rss_test"
stage gates "$venv/bin/bmoe-edge" gates --quick
stage fuzz "$venv/bin/bmoe-edge" fuzz --count "$fuzz_count" --out "$logs/fuzz" --workdir "$logs/fuzz-work"
rm -rf "$logs/fuzz-work"
unset LD_PRELOAD

shopt -s nullglob
reports=("$logs"/asan.*)
ub=$(cat "$logs"/*.log | grep -c 'runtime error:' || true)
if ((${#reports[@]})); then
  echo "ASan reports (${#reports[@]} files in $logs):"
  for r in "${reports[@]}"; do echo "--- $r"; head -60 "$r"; done
fi
((ub)) && { echo "UBSan reports in the stage logs:"; grep -h -A12 'runtime error:' "$logs"/*.log | head -100; }
if ((${#failed[@]})) || ((${#reports[@]})) || ((ub)); then
  echo "sanitize: failed stages: ${failed[*]:-none}; ${#reports[@]} ASan report files, $ub UBSan reports; logs in $logs" >&2
  exit 1
fi
echo "sanitize: clean (tests, gates --quick, fuzz --count $fuzz_count; llama.cpp instrumented: $llama); logs in $logs"
