# Sourced (`source scripts/gpu_env.sh`) from the repository root by every device-machine script: the
# environment of a run on a bare device machine, where repro is not installed and nothing downloads.
#
# - the wheels carried in .whl/ (fla), when there are any, installed into /tmp/site;
#   PYTHONPATH=/tmp/site:<checkout>;
# - Triton's cache at a fixed path (TRITON_CACHE_DIR=/tmp/triton-cache, REPRO_TRITON_CACHE overrides it:
#   the cache's index files hold absolute paths, so it must be restored where it was saved), filled from a
#   carried .triton-cache.txz (or an older .tgz) when there is one, so that a fresh machine does not compile
#   again the kernels an earlier call compiled (~100 s a call for the routes' kernels); a kernel whose
#   source, Triton or driver changed misses the cache and compiles as before;
# - save_triton_cache DIR: the cache's compiled kernels (metadata, cubins and the built launchers: what a
#   cache hit loads; not the IR text) into DIR/triton-cache.txz when it stays under the 16 MiB a file that
#   comes back from $OUT may have; copy it to the checkout's .triton-cache.txz (ignored by git) and carry
#   it in the next call. xz, not gzip: cubins compress to half gzip's bytes (a 68 MB cache: 7.8 against 16.1
#   MB), and the archive travels beside the whole tracked tree under the device's 64 MiB.
export PYTHONUNBUFFERED=1
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
export TRITON_CACHE_DIR=${REPRO_TRITON_CACHE:-/tmp/triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
for carried in .triton-cache.txz .triton-cache.tgz; do
  if [ -f "$carried" ]; then
    tar -xf "$carried" -C "$(dirname "$TRITON_CACHE_DIR")" &&
      echo "gpu_env: Triton cache restored ($(find "$TRITON_CACHE_DIR" -name '*.json' | wc -l) files of metadata)"
    break
  fi
done
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD

save_triton_cache() {
  local archive parent name
  local packer='xz -T0' suffix=txz
  command -v xz > /dev/null || packer=gzip suffix=tgz  # a machine without xz keeps the gzip archive
  archive=$(cd "$1" && pwd)/triton-cache.$suffix || return 0
  parent=$(dirname "$TRITON_CACHE_DIR") name=$(basename "$TRITON_CACHE_DIR")
  (cd "$parent" && find "$name" -type f \( -name '*.json' -o -name '*.cubin' -o -name '*.so' \) -print0 |
    tar -I "$packer" -cf "$archive" --null -T -) || return 0
  if [ "$(stat -c %s "$archive")" -gt $((16 * 1024 * 1024)) ]; then
    echo "gpu_env: Triton cache over 16 MiB, not kept"; rm -f "$archive"
  else
    echo "gpu_env: Triton cache saved ($(du -h "$archive" | cut -f1))"
  fi
}
