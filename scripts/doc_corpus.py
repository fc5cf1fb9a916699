"""Writes a real-text corpus of about 60 MB from the English documentation Debian packages ship,
for experiments that read more tokens than one epoch of the embedded tinyshakespeare (0.3M tokens).

    sudo apt-get install -y --no-install-recommends python3.11-doc linux-doc-6.1 perl-doc git-doc \
        postgresql-doc-15 python-django-doc python-sqlalchemy-doc python-scipy-doc sphinx-doc debian-handbook
    python scripts/doc_corpus.py --out corpora/debian_docs
    python -m andrea_jax.data.prepare --source files --path corpora/debian_docs \
        --out corpora/debian_docs_prepared --vocab-size 8449 --workers 2 --shards 8

Why these: they install offline from the distribution's own mirror (no web crawl, no licence
question beyond the packages' own), they are prose written by people (reStructuredText, POD and
AsciiDoc sources where a package ships them; the text of its HTML pages where it does not), and
together they give more than 20M tokens of the project's 8449-token BPE (docs/DATA.md gives the
measured count). One document is one source file; the files are written in a fixed order, so the
corpus is the same on every machine with the same package versions.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import pathlib
import subprocess
import sys

# (name, root, glob patterns): the text sources of each package's documentation.
SOURCES = [
    ("python3.11-doc", "/usr/share/doc/python3.11/html/_sources", ["**/*.txt"]),
    ("linux-doc-6.1", "/usr/share/doc/linux-doc-6.1/Documentation", ["**/*.rst.gz", "**/*.txt.gz", "**/*.rst"]),
    ("perl-doc", "/usr/share/perl", ["*/pod/*.pod"]),
    ("git-doc", "/usr/share/doc/git-doc", ["*.txt"]),
    ("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", ["*.html"]),
    ("python-django-doc", "/usr/share/doc/python-django-doc/html", ["*.html", "[!_]*/**/*.html"]),
    ("python-sqlalchemy-doc", "/usr/share/doc/python-sqlalchemy-doc", ["**/*.rst"]),
    ("python-scipy-doc", "/usr/share/doc/python-scipy-doc/html", ["*.html", "[!_]*/**/*.html"]),
    ("sphinx-doc", "/usr/share/doc/sphinx-doc/html/_sources", ["**/*.txt"]),
    ("debian-handbook", "/usr/share/doc/debian-handbook/html/en-US", ["*.html"]),
]


_BLOCKS = {"p", "div", "li", "ul", "ol", "pre", "br", "tr", "td", "th", "dt", "dd", "table", "section",
           "h1", "h2", "h3", "h4", "h5", "h6", "title", "blockquote"}


class _TextOfHtml(html.parser.HTMLParser):
    """The text of an HTML page: script and style dropped, a line break at each block element,
    whitespace kept inside <pre> (code) and collapsed elsewhere."""

    def __init__(self):
        super().__init__()
        self.lines, self._text, self._skipping, self._pre = [], [], 0, 0

    def _flush(self):
        text = "".join(self._text)
        self._text = []
        if text.strip():
            self.lines.append(text.strip("\n") if self._pre else " ".join(text.split()))

    def handle_starttag(self, tag, attrs):
        self._skipping += tag in ("script", "style")
        if tag in _BLOCKS:
            self._flush()
        self._pre += tag == "pre"

    def handle_endtag(self, tag):
        if tag in _BLOCKS:
            self._flush()
        self._skipping -= tag in ("script", "style") and self._skipping > 0
        self._pre -= tag == "pre" and self._pre > 0

    def handle_data(self, data):
        if not self._skipping:
            self._text.append(data)

    def close(self):
        super().close()
        self._flush()


def html_text(page: str) -> str:
    parser = _TextOfHtml()
    parser.feed(page)
    parser.close()
    return "\n".join(parser.lines) + "\n"


def read_text(path: pathlib.Path) -> str | None:
    """The file's text (gunzipped), or None when it is not UTF-8."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return html_text(text) if path.name.endswith(".html") else text


def write_corpus(out: pathlib.Path) -> dict[str, tuple[int, int]]:
    """{package: (documents, bytes)} written under out/PACKAGE/, one .txt per source file."""
    written = {}
    for name, root, patterns in SOURCES:
        root_path = pathlib.Path(root).resolve()
        if not root_path.is_dir():
            raise SystemExit(f"error: {root} is missing: install the Debian package {name} "
                             "(see this script's docstring)")
        # a folder may be reached twice through a symlink (perl's 5.36 -> 5.36.0): each file once
        paths = sorted({p.resolve() for pattern in patterns for p in root_path.glob(pattern)
                        if p.is_file() and p.resolve().is_relative_to(root_path)})
        documents = size = 0
        for path in paths:
            text = read_text(path)
            if not text or not text.strip():
                continue
            relative = str(path.relative_to(root_path)).removesuffix(".gz").replace("/", "__")
            target = out / name / (relative if relative.endswith(".txt") else relative + ".txt")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            documents, size = documents + 1, size + len(text.encode("utf-8"))
        written[name] = (documents, size)
    return written


def package_version(name: str) -> str:
    """The installed version of Debian package `name` (Debian updates its documentation, and the
    corpus with it), or "?" where dpkg does not know it."""
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True, text=True)
    except OSError:
        return "?"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "?"


def corpus_digest(out: pathlib.Path) -> str:
    """sha256 over the corpus's documents (relative name and text, in name order): two corpora are
    the same text exactly when their digests are equal."""
    digest = hashlib.sha256()
    for path in sorted(out.rglob("*.txt"), key=lambda p: p.relative_to(out).as_posix()):
        digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=pathlib.Path, help="a folder, made (must not exist)")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; give a new folder", file=sys.stderr)
        return 2
    written = write_corpus(args.out)
    for name, (documents, size) in written.items():
        print(f"{name}={package_version(name)}: {documents} documents, {size / 1e6:.1f} MB")
    documents, size = map(sum, zip(*written.values()))
    print(f"total: {documents} documents, {size / 1e6:.1f} MB, sha256 {corpus_digest(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
