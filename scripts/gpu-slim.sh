#!/usr/bin/env bash
# Makes the working tree small enough to travel to a GPU machine that receives at most 64 MiB
# (tracked files, untracked files git does not ignore, and the paths sent with them), and
# puts it back:
#
#   scripts/gpu-slim.sh on     before the run: the large files the GPU check never reads
#                              (the video, sound and TinyFLUX weights, golden files of other
#                              models) leave git's index, the files themselves staying on
#                              disk, and .git/info/exclude ignores them
#   scripts/gpu-slim.sh off    after the run: the index and .git/info/exclude as they were
#   scripts/gpu-slim.sh size   what would travel now, in MiB
#
# The check reads the staged binaries (gpu-stage/, sent as an extra path), TinyDiT's weights
# and the FLUX golden file; everything it needs stays tracked. Nothing is committed: `off`
# restores the index entries from HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."

git_dir=$(git rev-parse --git-dir)
list="$git_dir/flashdiff-gpu-slim"
exclude="$git_dir/info/exclude"
begin="# flashdiff gpu-slim: begin"
end="# flashdiff gpu-slim: end"
# Not read by scripts/gpu-run.sh.
patterns=(
  'models/tinyvideo/*.safetensors'
  'models/tinyaudio/*.safetensors'
  'models/tinyflux/*/*.safetensors'
  'models/checkers/golden.safetensors'
  'models/reference/sd3*.safetensors'
  'models/reference/sao_*.safetensors'
  'models/reference/wan_*.safetensors'
)

travelling_mib() {
  git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -r stat -c %s -- 2>/dev/null \
    | awk '{s += $1} END {printf "%.1f", s / 1048576}'
}

case "${1:-}" in
  on)
    if [ -f "$list" ]; then
      echo "gpu-slim: already on (run 'scripts/gpu-slim.sh off' first)" >&2
      exit 1
    fi
    echo "before: $(travelling_mib) MiB would travel"
    git ls-files -z -- "${patterns[@]}" > "$list"
    if [ ! -s "$list" ]; then
      rm -f "$list"
      echo "gpu-slim: none of the large files is tracked; nothing to do" >&2
      exit 1
    fi
    mkdir -p "$git_dir/info"
    { echo "$begin"; printf '%s\n' "${patterns[@]}"; echo "$end"; } >> "$exclude"
    xargs -0 git rm -q --cached -- < "$list"
    echo "after: $(travelling_mib) MiB would travel (gpu-stage/ adds its own size when sent)"
    ;;
  off)
    if [ ! -f "$list" ]; then
      echo "gpu-slim: not on; nothing to restore" >&2
      exit 1
    fi
    xargs -0 git reset -q HEAD -- < "$list"
    rm -f "$list"
    if [ -f "$exclude" ]; then
      sed -i "/^$begin\$/,/^$end\$/d" "$exclude"
    fi
    echo "restored: $(travelling_mib) MiB would travel"
    ;;
  size)
    echo "$(travelling_mib) MiB would travel"
    ;;
  *)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac
