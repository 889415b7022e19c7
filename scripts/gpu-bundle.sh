#!/usr/bin/env bash
# Builds, HERE, everything a GPU run needs and packs it into build-gpu/hybra-gpu.tar.xz (ignored, under
# 40 MiB), which the `device` tool carries to the lent GPU machine, where scripts/gpu-run.sh unpacks and runs
# it. That machine runs another image (CUDA 13.0, no Boost, doctest, OpenBLAS or Google Benchmark, no
# network, 64 MiB carried), so the bundle holds:
#   - programs: the `gpu` test cases (hybra_gpu_tests), examples/cuda_fusion (nvcc), benchmarks/bench_cuda,
#     examples/train_lenet and examples/train_resnet; Release, -march=x86-64-v3 (never native: this CPU is not
#     that one), libstdc++, libgcc, libgomp, OpenBLAS, Boost.JSON and zlib linked statically; built without
#     oneDNN, which Debian ships as a shared library only and which serves only CPU convolutions (the GPU
#     tests' CPU references run on hybra's own kernels). Debian ships Google Benchmark as a
#     shared library only: bench_cuda finds it (and the libstdc++ it needs) in lib/ by its RPATH. Each
#     program carries all of OpenBLAS (30 MB); one solid xz archive stores the copies once;
#   - hybra's headers and kernels/, which NVRTC compiles there (HYBRA_INCLUDE_DIR, HYBRA_KERNELS_DIR);
#   - the kernel cache, filled by running those programs here against the stand-in driver (tests/fake_cuda):
#     every kernel they compile with NVRTC is compiled here, so the GPU's minutes go to running;
#   - a slice of Fashion-MNIST for the training run (the whole set is 30 MB);
#   - the stand-ins themselves (fake/), so that gpu-run.sh can be checked here (HYBRA_GPU_STANDIN=1).
# A session that is lent a GPU builds this and runs scripts/gpu-run.sh there FIRST, before any other work
# (docs/cuda.md, "Running on a lent GPU").
#
# Environment: HYBRA_GPU_TREE (the build directory, default build-gpu-tree; the unpacked bundle is its
# bundle/), HYBRA_GPU_BUNDLE (the folder the archive goes to, default build-gpu).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
tree=${HYBRA_GPU_TREE:-build-gpu-tree}
bundle=$tree/bundle
archive_dir=${HYBRA_GPU_BUNDLE:-build-gpu}
start=$SECONDS
say() { printf 'gpu-bundle.sh [%3ds] %s\n' $((SECONDS - start)) "$*"; }
die() { echo "gpu-bundle.sh: ERROR: $*" >&2; exit 1; }

command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || die "nvcc not found: cuda_fusion needs it"
export PATH=$PATH:/usr/local/cuda/bin
gcc_lib=$(dirname "$(g++ -print-file-name=libgomp.a)")
for lib in "$gcc_lib/libgomp.a" "$gcc_lib/libgfortran.a" "$gcc_lib/libquadmath.a"; do
  [[ -f $lib ]] || die "$lib is missing: the bundle links it statically"
done

# What static OpenBLAS needs (gfortran, quadmath) at the end of the link line; OpenMP is libgomp's archive
# (FindOpenMP's OpenMP_gomp_LIBRARY).
static_runtime="$gcc_lib/libgfortran.a $gcc_lib/libquadmath.a"
say "configure $tree"
cmake -S . -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=Release --log-level=WARNING \
  -DHYBRA_BUILD_TESTS=ON -DHYBRA_BUILD_EXAMPLES=ON -DHYBRA_BUILD_BENCHMARKS=ON -DHYBRA_OPTIMIZE_PROGRAMS=ON \
  -DCMAKE_CXX_FLAGS="-march=x86-64-v3" -DCMAKE_CUDA_FLAGS="-Xcompiler=-march=x86-64-v3" \
  -DHYBRA_BENCHMARK_MARCH=x86-64-v3 -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc -Wl,--disable-new-dtags" \
  -DCMAKE_CXX_STANDARD_LIBRARIES="$static_runtime" -DOpenMP_gomp_LIBRARY="$gcc_lib/libgomp.a" \
  -DBLA_STATIC=ON -DBoost_USE_STATIC_LIBS=ON -DZLIB_USE_STATIC_LIBS=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DHYBRA_ONEDNN=OFF \
  -DCMAKE_BUILD_RPATH='$ORIGIN/../lib'
programs=(hybra_gpu_tests cuda_fusion bench_cuda train_lenet train_resnet)
say "build ${programs[*]} and the stand-ins"
cmake --build "$tree" --parallel "$(nproc)" --target "${programs[@]}" hybra_fake_cuda hybra_fake_cublas hybra_fake_nccl

say "stage $bundle"
rm -rf "$bundle"
mkdir -p "$bundle"/{bin,lib,include,share/hybra,data/fashion-mnist}
for p in tests/hybra_gpu_tests examples/cuda_fusion benchmarks/bench_cuda examples/train_lenet examples/train_resnet; do
  [[ -x $tree/$p ]] || die "built $p but found no executable $tree/$p"
  strip -o "$bundle/bin/$(basename "$p")" "$tree/$p"
done
# bench_cuda's shared libraries (Debian has no static Google Benchmark), found in lib/ by its RPATH (an RPATH,
# not a RUNPATH, so that libbenchmark's own libstdc++ is found there too).
for lib in $(ldd "$bundle/bin/bench_cuda" | awk '/libbenchmark|libstdc\+\+|libgcc_s/ {print $3}'); do
  cp -L "$lib" "$bundle/lib/"
done
cp -r include/hybra "$bundle/include/"
cp -r kernels "$bundle/share/hybra/"
mkdir -p "$bundle/fake"
for lib in hybra_fake_cuda hybra_fake_cublas hybra_fake_nccl; do
  cp "$tree/tests/lib$lib.so" "$bundle/fake/"
done

# Every binary must load on the GPU machine's image: glibc, the bundle's own lib/ and nothing else (CUDA's
# libraries are opened at run time; cuda_fusion links the CUDA runtime statically).
for exe in "$bundle"/bin/*; do
  extra=$(ldd "$exe" | awk '$3 ~ /^\// {print $3}' | xargs -r realpath | grep -vE '/(libc|libm|libmvec|libdl|libpthread|librt|ld-linux-x86-64)\.so' |
          grep -v "^$(realpath "$bundle")/lib/" || true)
  [[ -z $extra ]] || die "$(basename "$exe") needs libraries the GPU machine may not have: $extra"
done

# A slice of Fashion-MNIST: the first 12288 training images and the whole test set.
python3 - "$bundle/data/fashion-mnist" <<'EOF'
import gzip, struct, sys
src, dst, keep = "/usr/share/datasets/fashion-mnist", sys.argv[1], 12288
for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
             "t10k-labels-idx1-ubyte.gz"):
    data = gzip.open(f"{src}/{name}").read()
    magic, count = struct.unpack(">II", data[:8])
    dims = (magic & 0xff) - 1  # dimensions after the count
    item = 1
    for d in struct.unpack(f">{dims}I", data[8:8 + 4 * dims]):
        item *= d
    n = min(count, keep) if name.startswith("train") else count
    head = struct.pack(">II", magic, n) + data[8:8 + 4 * dims]
    with gzip.open(f"{dst}/{name}", "wb", compresslevel=9) as out:
        out.write(head + data[8 + 4 * dims: 8 + 4 * dims + n * item])
EOF

git -C "$root" rev-parse HEAD >"$bundle/COMMIT"
git -C "$root" status --short >>"$bundle/COMMIT"

# The kernels the programs use: run against the stand-in, from the cache the last bundle left in $tree (hits
# refresh an entry's time), then keep in the bundle the entries this run used.
say "fill the kernel cache against the stand-in driver"
mkdir -p "$tree/kernel_cache" "$bundle/kernel_cache"
cp -p "$tree/kernel_cache/." "$bundle/kernel_cache/" -r
touch "$tree/fill.start"
sleep 1
HYBRA_GPU_STANDIN=1 OUT="$tree/fill" bash scripts/gpu-run.sh "$bundle" >"$tree/fill.log" 2>&1 ||
  { tail -n 30 "$tree/fill.log" >&2; die "filling the kernel cache failed (log: $tree/fill.log)"; }
cat "$tree/fill/summary.txt"
find "$bundle/kernel_cache" -name '*.hkc' ! -newer "$tree/fill.start" -delete
cp -p "$bundle/kernel_cache/." "$tree/kernel_cache/" -r

# Kernels an earlier GPU run compiled there and sent back (gpu-run.sh's kernels.tar.gz, put in $archive_dir)
# join the cache; then $archive_dir holds the archive alone.
for extra in "$archive_dir"/kernels*.tar.gz; do
  [[ -f $extra ]] && tar -xzf "$extra" -C "$bundle/kernel_cache"
done
say "pack $archive_dir/hybra-gpu.tar.xz"
rm -rf "$archive_dir"
mkdir -p "$archive_dir"
tar -C "$bundle" -cf - . | xz -9 -T"$(nproc)" >"$archive_dir/hybra-gpu.tar.xz"
size=$(du -sm "$archive_dir" | cut -f1)
((size < 40)) || die "$archive_dir is ${size} MiB, over the 40 MiB it may carry"
say "done: $archive_dir is ${size} MiB ($(du -sm "$bundle" | cut -f1) MiB unpacked), $(find "$bundle/kernel_cache" -name '*.hkc' | wc -l) kernels in its cache"
