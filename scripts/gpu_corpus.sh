#!/usr/bin/env bash
# The documentation corpus that scripts/gpu_width.sh trains on, small enough to travel to the GPU
# machine beside the wheels: a device call carries at most 64 MiB with the tracked files, and L's
# whole prepared corpus (corpora/debian_docs_prepared) is 49 MiB. Every 8th document of the raw
# corpus, in the order `prepare` reads it (so each package keeps its share and the validation tail
# is still the last packages' text), tokenized by L's own tokenizer (the prepared corpus's
# tokenizer.json), into .gpu_corpus/, which ignores itself: 3.27M tokens, 6.4 MiB. A run's 2000 x 8
# x 32 training tokens are a sixth of its training part (95%), so no token is read twice.
#
#   bash scripts/gpu_corpus.sh [RAW [PREPARED]]  # defaults: corpora/debian_docs, corpora/debian_docs_prepared
#   device run, carry [".whl", ".gpu_corpus"]:  bash scripts/gpu_width.sh
set -eu
cd "$(dirname "$0")/.."
raw="${1:-corpora/debian_docs}"
prepared="${2:-corpora/debian_docs_prepared}"
out=.gpu_corpus
py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
picked="$(mktemp -d)"
trap 'rm -rf "$picked"' EXIT
# find_files is the order prepare reads the folder in: every 8th of that list is a uniform sample.
"$py" - "$raw" "$picked" <<'PY'
import pathlib, shutil, sys
from andrea_jax.data import documents
raw, picked = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2])
files = documents.find_files(str(raw), "RAW")
for path in files[::8]:
    (picked / path.relative_to(raw)).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, picked / path.relative_to(raw))
print(f"{len(files[::8])} of {len(files)} documents")
PY
rm -rf "$out"
"$py" -m andrea_jax.data.prepare --source files --path "$picked" --out "$out" \
  --tokenizer "$prepared/tokenizer.json" --workers 2 --shards 1
echo '*' > "$out/.gitignore"   # git, and so the device tool, leaves it behind unless carried
"$py" -c "import json, sys; m = json.load(open(sys.argv[1])); print(m['tokens'], 'tokens')" "$out/manifest.json"
du -sh "$out"
