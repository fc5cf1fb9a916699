#!/usr/bin/env bash
# The data stack's wheels for the GPU machine (Python 3.12, x86-64), whose image lacks grain and
# tensorflow-datasets, into .whl/ (git-ignored), the versions this venv tested; the device tool
# carries the folder (`carry: [".whl", ".gpu_corpus"]`, the corpus from scripts/gpu_corpus.sh) and
# scripts/gpu_width.sh installs it there.
#
#   bash scripts/gpu_wheels.sh
set -eu
cd "$(dirname "$0")/.."
py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
mkdir -p .whl
echo '*' > .whl/.gitignore   # ignored by git, and so left behind by the device tool unless carried, in a worktree too
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
# What a run on the embedded corpus imports beyond the GPU image: grain and its array_record and
# portpicker; tensorflow-datasets and its dm-tree, immutabledict, promise, tensorflow-metadata, toml.
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 tensorflow-datasets==4.9.10 dm-tree==0.1.10 \
  immutabledict==4.3.1 tensorflow-metadata==1.21.0 toml==0.10.2 simple-parsing==0.1.9 termcolor==3.3.0 \
  importlib-resources==7.1.0 docstring-parser==0.18.0
"$py" -m pip wheel -q --no-deps -w .whl promise==2.3   # a source distribution only; pure Python
du -sh .whl && ls .whl
