"""The corpora the data tests write, and the preparation command run over one in this process."""
import json

from andrea_jax.data import pipeline
from andrea_jax.data.prepare import driver

SHAKESPEARE = pipeline.read_text(pipeline.EMBEDDED_CORPUS)
PARAGRAPHS = [p for p in SHAKESPEARE[:60_000].split("\n\n") if p.strip()]
LAST_DOCUMENT = "The very last document.\n"


def write_corpus(folder, n_files=4, paragraphs=PARAGRAPHS):
    """n_files .jsonl files of `paragraphs` and one .txt in `folder` (made); returns the folder.
    Its documents, in corpus order, are [*paragraphs, LAST_DOCUMENT]."""
    folder.mkdir(parents=True)
    for f in range(n_files):
        part = paragraphs[f * len(paragraphs) // n_files:(f + 1) * len(paragraphs) // n_files]
        (folder / f"part{f}.jsonl").write_text("".join(json.dumps({"text": p}) + "\n" for p in part))
    (folder / "z_last.txt").write_text(LAST_DOCUMENT)
    return folder


def write_nested_corpus(folder):
    """Four files in a nested folder, and a .md the reader skips; returns the documents in the
    order the builder must keep."""
    (folder / "sub").mkdir(parents=True)
    docs_b = [SHAKESPEARE[3000:3400], "second jsonl document, ünïcödé 🎉", SHAKESPEARE[5000:5600]]
    (folder / "a.txt").write_text(SHAKESPEARE[:2000], encoding="utf-8")
    (folder / "b.jsonl").write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs_b))
                                    + "\n\n", encoding="utf-8")
    (folder / "sub" / "c.txt").write_text(SHAKESPEARE[8000:9000], encoding="utf-8")
    (folder / "notes.md").write_text("not read: only .txt and .jsonl are")
    return [SHAKESPEARE[:2000], *docs_b, SHAKESPEARE[8000:9000]]


def run_prepare(corpus, out, *extra, shards=3, workers=1):
    """`andrea-prepare` over the files of `corpus` into `out`; its exit code. One worker: the direct
    runner runs in this process (a test of worker processes asks for more)."""
    return driver.main(["--source", "files", "--path", str(corpus), "--out", str(out), "--shards", str(shards),
                         "--workers", str(workers), *extra])
