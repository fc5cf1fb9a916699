"""A small corpus of the embedded text for the preparation tests: paragraphs as documents."""
import json

from andrea_jax.data import pipeline

PARAGRAPHS = [p for p in pipeline.read_text(pipeline.EMBEDDED_CORPUS)[:60_000].split("\n\n") if p.strip()]


def write_corpus(folder, n_files=4):
    """n_files .jsonl files of paragraphs and one .txt in `folder` (made); returns the folder."""
    folder.mkdir(parents=True)
    for f in range(n_files):
        part = PARAGRAPHS[f * len(PARAGRAPHS) // n_files:(f + 1) * len(PARAGRAPHS) // n_files]
        (folder / f"part{f}.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in part))
    (folder / "z_last.txt").write_text("The very last document.\n")
    return folder
