#!/usr/bin/env bash
# keep.sh RUNS ARCHIVE: packs the finished runs of the sweep folder RUNS (each run folder that holds
# result.json, in its group's folder or, as a ladder's rung groups are, one folder deeper) with the
# code snapshot and the sweep's bookkeeping into ARCHIVE (.tar.xz), leaving out checkpoints and
# per-run tokenizer copies, which no report reads. A sweep that outlives one machine goes on on the
# next from the unpacked archive (`tar -xJf ARCHIVE -C RUNS`, then the same
# sweep command): the runner skips every run whose result.json holds the same command.
set -euo pipefail
runs=$1 archive=$(realpath -m "$2")
cd "$runs"
mapfile -t finished < <(find . -mindepth 3 -maxdepth 4 -name result.json -printf '%h\n' | sort)
mapfile -t books < <(find . -mindepth 2 -maxdepth 3 \( -name experiment.json -o -name wall.json \) | sort)
tar -cJf "$archive" --exclude=checkpoints --exclude=tokenizer.json --exclude=.lock code "${books[@]}" "${finished[@]}"
echo "kept ${#finished[@]} finished runs of $runs in $archive ($(du -h "$archive" | cut -f1))"
