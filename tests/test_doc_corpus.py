"""scripts/doc_corpus.py: the Debian documentation corpus, on a fake package tree (the real one
needs the Debian packages its docstring installs)."""
import gzip
import hashlib
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("doc_corpus", ROOT / "scripts" / "doc_corpus.py")
doc_corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(doc_corpus)

PAGE = """<html><head><title>Sessions</title><style>p { color: red }</style>
<script>var x = "not text";</script></head><body>
<p>Django provides   full support
for <a href="#">anonymous</a> sessions.</p>
<pre><span>def</span> <span>f</span>():
    <span>return</span> 1</pre>
<ul><li>one</li><li>two</li></ul></body></html>"""


def test_html_text_keeps_the_words_drops_scripts_and_keeps_code_whitespace():
    assert doc_corpus.html_text(PAGE) == ("Sessions\nDjango provides full support for anonymous sessions.\n"
                                          "def f():\n    return 1\none\ntwo\n")


def test_each_source_file_becomes_one_text_document_in_a_fixed_order(tmp_path, monkeypatch, capsys):
    linux, site = tmp_path / "linux", tmp_path / "site"
    (linux / "sub").mkdir(parents=True)
    (linux / "sub" / "a.rst.gz").write_bytes(gzip.compress("Kernel text.\n".encode()))
    (linux / "b.txt.gz").write_bytes(gzip.compress(b"\xff\xfe not utf-8"))  # skipped
    (site / "guide").mkdir(parents=True)
    (site / "guide" / "index.html").write_text(PAGE)
    (site / "_static").mkdir()
    (site / "_static" / "theme.html").write_text("<p>navigation</p>")  # not a page of the docs
    monkeypatch.setattr(doc_corpus, "SOURCES", [("linux", str(linux), ["**/*.rst.gz", "**/*.txt.gz"]),
                                                ("site", str(site), ["*.html", "[!_]*/**/*.html"])])
    monkeypatch.setattr(doc_corpus, "package_version", {"linux": "6.1.176-1", "site": "3.2.25"}.get)
    out = tmp_path / "corpus"
    assert doc_corpus.main(["--out", str(out)]) == 0
    # each package's version, and the digest of the documents' names and texts in name order
    site_text = (out / "site" / "guide__index.html.txt").read_bytes()
    digest = hashlib.sha256(b"linux/sub__a.rst.txt\0Kernel text.\n\0site/guide__index.html.txt\0" + site_text + b"\0")
    assert capsys.readouterr().out.splitlines() == [
        "linux=6.1.176-1: 1 documents, 0.0 MB", "site=3.2.25: 1 documents, 0.0 MB",
        f"total: 2 documents, 0.0 MB, sha256 {digest.hexdigest()}"]
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.txt")) == ["linux/sub__a.rst.txt",
                                                                            "site/guide__index.html.txt"]
    assert (out / "linux" / "sub__a.rst.txt").read_text() == "Kernel text.\n"
    assert doc_corpus.main(["--out", str(out)]) == 2  # never writes into an existing corpus
    monkeypatch.setattr(doc_corpus, "SOURCES", [("missing-doc", str(tmp_path / "nowhere"), ["*.txt"])])
    try:
        doc_corpus.main(["--out", str(tmp_path / "other")])
    except SystemExit as e:
        assert "install the Debian package missing-doc" in str(e)
    else:
        raise AssertionError("a missing package was not reported")


def test_the_digest_changes_with_one_byte_or_one_name(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / name / "p").mkdir(parents=True)
        (tmp_path / name / "p" / "x.txt").write_text("same text\n")
    (tmp_path / "b" / "p" / "x.txt").write_text("same text!\n")
    (tmp_path / "c" / "p" / "x.txt").rename(tmp_path / "c" / "p" / "y.txt")
    digests = {name: doc_corpus.corpus_digest(tmp_path / name) for name in ("a", "b", "c")}
    assert len(set(digests.values())) == 3
    assert doc_corpus.corpus_digest(tmp_path / "a") == digests["a"]


def test_a_package_dpkg_does_not_know_has_version_question_mark():
    assert doc_corpus.package_version("no-such-package-andrea") == "?"
