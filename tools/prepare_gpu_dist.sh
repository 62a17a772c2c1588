#!/usr/bin/env bash
# Run HERE (the CPU machine, nvcc 13.0) before tools/gpu_check_dist.sh runs on the GPU machine.
# Builds, from a clean clone of HEAD (so the wheels are exactly a commit, whatever the working
# tree holds), what a release of that commit would hold, for the H100 only:
#   .gpu/artifacts/repo       the sm_90a cubins as a directory repository (tools/cubin_build.py)
#   .gpu/artifacts/lock.json  its lock (release, manifest sha256), as `nox -s release` writes it
#   .gpu/wheels_set/          flashinfer-python (pinning that manifest), flashinfer-jit-cache
#                             (sm_90a; scale, norm, activation, rope, quantization), flashinfer-cubin
#                             (that release), checked by tools/wheels/check.py, plus the wheels the
#                             GPU image lacks (apache-tvm-ffi cp312, click); COMMIT names the commit
#   usage: bash tools/prepare_gpu_dist.sh      (PYTHON: an interpreter with torch, build,
#          hatchling, apache-tvm-ffi and ninja; default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${PYTHON:-python3}
archs=${GPU_ARCHS:-9.0a}
modules=${GPU_MODULES:-scale,norm,activation,rope,quantization}
commit=$(git rev-parse HEAD)
src=$(mktemp -d /tmp/fi-gpu-src.XXXX)
ws=$(mktemp -d /tmp/fi-gpu-ws.XXXX)
trap 'rm -rf "$src" "$ws"' EXIT
git clone -q "$repo" "$src"
version=$(cat "$src/version.txt")

rm -rf .gpu/artifacts .gpu/wheels_set && mkdir -p .gpu/artifacts .gpu/wheels_set
"$python" "$src/tools/cubin_build.py" --version "$version" --archs "$archs" \
  --out "$repo/.gpu/artifacts/repo" --jobs "$(nproc)"
rm -rf .gpu/artifacts/repo/.build
sha=$(sha256sum ".gpu/artifacts/repo/releases/$version/manifest.json" | cut -d' ' -f1)
printf '{"release": "%s", "manifest_sha256": "%s", "repositories": []}\n' "$version" "$sha" \
  > .gpu/artifacts/lock.json

export FLASHINFER_ARTIFACT_LOCK=$repo/.gpu/artifacts/lock.json
export FLASHINFER_CUBIN_RELEASE=$repo/.gpu/artifacts/repo
export FLASHINFER_CUDA_ARCH_LIST=$archs FLASHINFER_AOT_MODULES=$modules FLASHINFER_WORKSPACE_BASE=$ws
for pkg in flashinfer-python flashinfer-jit-cache flashinfer-cubin; do
  "$python" -m build --no-isolation --wheel --outdir "$repo/.gpu/wheels_set" "$src/packages/$pkg"
done
"$python" "$src/tools/wheels/check.py" .gpu/wheels_set --version "$version"

# The GPU image (Python 3.12, no index) lacks these; apache-tvm-ffi exactly as the jit-cache pins.
tvm=$("$python" -c "from importlib.metadata import version; print(version('apache-tvm-ffi'))")
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any -d .gpu/wheels_set "apache-tvm-ffi==$tvm" click
echo "$commit" > .gpu/wheels_set/COMMIT
ls -la .gpu/wheels_set .gpu/artifacts
du -sh .gpu
echo "release $version of $commit, manifest sha256 $sha"
