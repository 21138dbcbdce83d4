#!/usr/bin/env bash
# Builds qvl for the GPU machine, here, and assembles build-dev/ to carry there:
#   build-dev/qvl, build-dev/qvl_gpu_tests (stripped), build-dev/lib/*.so* (the shared libraries
#   they need that Ubuntu 24.04 may lack), build-dev/env.sh (sets LD_LIBRARY_PATH there).
# The object files live in build-devobj/ (not carried). On the GPU machine:
#   source build-dev/env.sh && build-dev/qvl ... && build-dev/qvl_gpu_tests
# (or LD_LIBRARY_PATH=build-dev/lib build-dev/qvl ...; cuBLASLt comes from the machine's CUDA 13).
# Options (environment): QVL_DEV_ARCHS (default 90), JOBS (default 2), QVL_DEV_TARGETS.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
archs=${QVL_DEV_ARCHS:-90}
jobs=${JOBS:-2}
obj=build-devobj
out=build-dev

# $ORIGIN/lib first, then where CUDA 13's cuBLASLt lives on the GPU machine (toolkit, or the
# pip wheel beside torch) so qvl finds it even without env.sh.
rpath='$ORIGIN/lib:/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib64:/usr/local/cuda/targets/x86_64-linux/lib'
rpath+=':/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib'
rpath+=':/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib'

cmake -S . -B "$obj" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQVL_ENABLE_CUDA=ON -DQVL_CUDA_ARCHS="$archs" \
  -DCMAKE_BUILD_RPATH="$rpath" -DCMAKE_SKIP_BUILD_RPATH=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=OFF >/dev/null
targets=${QVL_DEV_TARGETS:-"qvl qvl_gpu_tests"}
have=$(ninja -C "$obj" -t targets all | sed -n 's/^\([A-Za-z0-9_]*\): .*/\1/p')
grep -qx qvl_cuda <<<"$have" || { echo "pack: CMake found no nvcc: no CUDA backend to build" >&2; exit 1; }
build_targets=()
[ -n "$targets" ] || { echo "pack: no targets" >&2; exit 1; }
for t in $targets; do
  if grep -qx "$t" <<<"$have"; then build_targets+=("$t"); else echo "pack: target $t does not exist yet, skipped" >&2; fi
done
start=$(date +%s)
cmake --build "$obj" -j"$jobs" --target "${build_targets[@]}"
echo "pack: built ${build_targets[*]} for sm_${archs} in $(( $(date +%s) - start )) s"

rm -rf "$out"
mkdir -p "$out/lib"
bins=()
for t in "${build_targets[@]}"; do
  src=$(find "$obj" -maxdepth 2 -type f -name "$t" -perm -u+x | head -1)
  [ -n "$src" ] || { echo "pack: built $t but cannot find it under $obj" >&2; exit 1; }
  cp "$src" "$out/$t"
  strip --strip-unneeded "$out/$t"
  bins+=("$out/$t")
done

# Shared libraries: everything ldd resolves except glibc, libstdc++/libgcc (newer on Ubuntu
# 24.04) and the CUDA driver/runtime/cuBLAS (the GPU machine's own CUDA 13 provides them).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libstdc\+\+|libgcc_s|libcuda\.so|libcublas|libcudart|libnvidia|libnvrtc)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
  strip --strip-unneeded "$out/lib/$name" 2>/dev/null || true
done
missing=$(for b in "${bins[@]}"; do ldd "$b" | grep "not found" | grep -v -E 'libcuda\.so' || true; done)
[ -z "$missing" ] || { echo "pack: unresolved libraries here:"; echo "$missing"; } >&2

cat > "$out/env.sh" <<'ENV'
# Source on the GPU machine from the repository root: puts build-dev/lib and CUDA 13's cuBLASLt
# on LD_LIBRARY_PATH and checks that qvl resolves every library.
qvl_dev_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
qvl_cublas=$(ls /usr/local/cuda/lib64/libcublasLt.so.13 /usr/local/cuda-13*/lib64/libcublasLt.so.13 \
  /usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.13 \
  "$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)"/nvidia/*/lib/libcublasLt.so.13 \
  2>/dev/null | head -1)
export LD_LIBRARY_PATH="$qvl_dev_dir/lib${qvl_cublas:+:$(dirname "$qvl_cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$qvl_dev_dir/qvl" | grep -q "not found"; then
  echo "build-dev/env.sh: unresolved libraries:" >&2; ldd "$qvl_dev_dir/qvl" | grep "not found" >&2
fi
ENV
git rev-parse HEAD > "$out/COMMIT" 2>/dev/null || true
echo "pack: $out ($(du -sh "$out" | cut -f1)), commit $(cat "$out/COMMIT" 2>/dev/null)"
ls -la "$out" "$out/lib"
