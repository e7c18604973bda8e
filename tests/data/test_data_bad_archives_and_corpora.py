"""Bad input: one-line errors (exit 2 from the CLI) or counted skips, and never half-finished output."""
import http.server
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from residual_fairseq.data import DataPreparationError, PrepareOptions, prepare
from residual_fairseq.data import pipeline, text
from residual_fairseq.data.cli import main
from residual_fairseq.data.download import download
from residual_fairseq.data.textio import SkipCounter, read_tsv_pairs
from helpers.data_builders import build_iwslt_archive, write_plain_pair, write_tgz

REPO = Path(__file__).resolve().parents[2]


def custom_options(tmp_path, train, out="out", **settings):
    settings.setdefault("vocab_size", 40)
    return PrepareOptions(dataset="custom", out=tmp_path / out, source_lang="de", target_lang="en", train=train,
                          valid_size=3, test_size=3, progress=False, **settings)


def iwslt_options(tmp_path, archive, **settings):
    return PrepareOptions(dataset="iwslt14-de-en", out=tmp_path / "out", from_archive=[archive], progress=False,
                          **settings)


def assert_nothing_left(tmp_path):
    assert not (tmp_path / "out").exists()
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".out.")]  # no staging dir


# --- archives ---------------------------------------------------------------------------------

def test_missing_archive(tmp_path):
    with pytest.raises(DataPreparationError, match="archive or directory not found: .*nowhere.tgz"):
        prepare(iwslt_options(tmp_path, tmp_path / "nowhere.tgz"))
    assert_nothing_left(tmp_path)


def test_corrupt_archive(tmp_path):
    archive = tmp_path / "de-en.tgz"
    archive.write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(DataPreparationError, match="de-en.tgz is corrupt or truncated"):
        prepare(iwslt_options(tmp_path, archive))
    assert_nothing_left(tmp_path)


def test_truncated_archive(tmp_path):
    archive = build_iwslt_archive(tmp_path / "full.tgz")
    truncated = tmp_path / "de-en.tgz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(DataPreparationError, match="corrupt or truncated"):
        prepare(iwslt_options(tmp_path, truncated))
    assert_nothing_left(tmp_path)


def test_archive_without_the_expected_files(tmp_path):
    archive = tmp_path / "other.tgz"
    write_tgz(archive, {"something/else.txt": "hello\n"})
    with pytest.raises(DataPreparationError, match="train.tags.de-en.de not found in .*archive is incomplete"):
        prepare(iwslt_options(tmp_path, archive))


# --- hostile archives: nothing lands outside the unpack dir, nothing fills the disk ---------------

def _tar_with(path, *members):
    """A .tgz of (TarInfo, bytes or None) members, written by hand (tarfile would refuse some)."""
    import io
    import tarfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as bundle:
        for info, payload in members:
            bundle.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _member(name, payload=b"x\n", kind=None, target=""):
    import tarfile

    info = tarfile.TarInfo(name)
    if kind is None:
        info.size = len(payload)
    else:
        info.type, info.linkname, payload = kind, target, None
    return info, payload


@pytest.mark.parametrize("name, members, refusal", [
    ("dotdot", [_member("de-en/../../escaped.txt")], "is outside the destination"),
    ("symlink out", [_member("de-en/link", kind=b"2", target="../../../..")], "outside the destination"),
    ("hard link out", [_member("de-en/hard", kind=b"1", target="/etc/passwd")], "outside the destination|absolute"),
    ("device", [_member("de-en/dev", kind=b"3")], "special file|device|is a"),
])
def test_hostile_tar_members_are_refused(name, members, refusal, tmp_path):
    from residual_fairseq.data.download import extract_archive

    archive = _tar_with(tmp_path / "in" / "de-en.tgz", *members)
    with pytest.raises(DataPreparationError, match=r"de-en\.tgz holds an unsafe member, refused: .*(" + refusal + ")"):
        extract_archive(archive, tmp_path / "in" / "deep" / "unpacked")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "in" / "escaped.txt").exists()
    with pytest.raises(DataPreparationError, match="unsafe member"):  # and through prepare: nothing left
        prepare(iwslt_options(tmp_path, archive))
    assert_nothing_left(tmp_path)


def test_absolute_tar_members_land_inside(tmp_path):
    from residual_fairseq.data.download import extract_archive

    escape = Path(f"/tmp/residual-fairseq-escape-{tmp_path.name}.txt")
    archive = _tar_with(tmp_path / "a.tgz", _member(str(escape)))
    into = extract_archive(archive, tmp_path / "unpacked")
    assert not escape.exists() and (into / str(escape).lstrip("/")).read_bytes() == b"x\n"


def test_zip_members_stay_inside(tmp_path):
    import zipfile

    from residual_fairseq.data.download import extract_archive

    archive = tmp_path / "in" / "a.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as bundle:
        bundle.writestr("../../escaped.txt", "x")
        bundle.writestr("/abs-escaped.txt", "x")
    into = extract_archive(archive, tmp_path / "in" / "unpacked")
    assert not (tmp_path / "escaped.txt").exists() and not Path("/abs-escaped.txt").exists()
    assert sorted(path.name for path in into.rglob("*") if path.is_file()) == ["abs-escaped.txt", "escaped.txt"]


def test_an_archive_that_would_fill_the_disk_is_refused(tmp_path, monkeypatch):
    """4 MiB of zeros compress to a few KiB; the declared sizes are checked against the free
    disk (here pretended to be headroom + 1 MiB) before each member is written."""
    import shutil as shutil_module
    from collections import namedtuple

    from residual_fairseq.data import download as download_module

    archive = _tar_with(tmp_path / "de-en.tgz", _member("de-en/small.txt", b"ok\n"),
                        _member("de-en/zeros.txt", bytes(4 << 20)))
    assert archive.stat().st_size < 100_000
    usage = namedtuple("usage", "total used free")
    free = download_module.DISK_HEADROOM_BYTES + (1 << 20)
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(free * 2, free, free))
    with pytest.raises(DataPreparationError, match=r"de-en\.tgz unpacks to more than the 0\.0 GiB free .*"
                                                   r"at member 'de-en/zeros\.txt'"):
        download_module.extract_archive(archive, tmp_path / "unpacked")
    assert not (tmp_path / "unpacked" / "de-en" / "zeros.txt").exists()
    monkeypatch.undo()
    into = download_module.extract_archive(archive, tmp_path / "unpacked-with-room")
    assert (into / "de-en" / "zeros.txt").stat().st_size == 4 << 20


# --- downloads (a local HTTP server: the tests stay offline) -------------------------------------

PAYLOAD = bytes(range(256)) * 64  # 16 KiB


class FlakyServer(http.server.BaseHTTPRequestHandler):
    """Serves PAYLOAD with Range support; ``cut_at`` makes it hang up early (a broken connection)."""

    cut_at = None
    ranges_seen = []

    def do_GET(self):
        start = 0
        if self.headers.get("Range"):
            FlakyServer.ranges_seen.append(self.headers["Range"])
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
        body = PAYLOAD[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: self.cut_at] if self.cut_at else body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyServer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    FlakyServer.cut_at, FlakyServer.ranges_seen = None, []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/de-en.tgz"
    httpd.shutdown()


def test_truncated_download_is_reported_then_resumed_with_a_range_request(tmp_path, server):
    destination = tmp_path / "downloads" / "de-en.tgz"
    FlakyServer.cut_at = 5000
    with pytest.raises(DataPreparationError, match=r"truncated download of http://127.0.0.1:\d+/de-en.tgz: got 5000 of 16384"):
        download([server], destination, progress=False)
    assert not destination.exists() and destination.with_name("de-en.tgz.part").stat().st_size == 5000
    FlakyServer.cut_at = None
    download([server], destination, expected_sha256=sha256_of_bytes(PAYLOAD), progress=False)
    assert FlakyServer.ranges_seen == ["bytes=5000-"]
    assert destination.read_bytes() == PAYLOAD


def test_checksum_mismatch(tmp_path, server):
    with pytest.raises(DataPreparationError, match="checksum mismatch"):
        download([server], tmp_path / "x.tgz", expected_sha256="0" * 64, progress=False)


def test_network_failure_names_the_url(tmp_path):
    url = "http://127.0.0.1:9/de-en.tgz"  # the discard port: connection refused
    with pytest.raises(DataPreparationError, match=r"^download failed: http://127.0.0.1:9/de-en.tgz \(.*--from-archive"):
        download([url], tmp_path / "de-en.tgz", progress=False)


def sha256_of_bytes(data):
    import hashlib

    return hashlib.sha256(data).hexdigest()


# --- text -------------------------------------------------------------------------------------

def test_mismatched_line_counts(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 20)
    target.write_text("".join(target.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(DataPreparationError, match=r"line counts differ: .*corpus.de has 20 lines, .*corpus.en has 19"):
        prepare(custom_options(tmp_path, [source, target]))
    assert_nothing_left(tmp_path)


def test_tsv_rows_without_a_target_are_counted(tmp_path):
    path = tmp_path / "x.tsv"
    path.write_bytes(b"a\tb\nno tab here\n\xff\tbad\n")
    skips = SkipCounter()
    sources, targets = read_tsv_pairs(path, skips)
    assert (sources[0], targets[0], skips.as_dict()) == ("a", "b", {"bad_tsv_row": 1})
    assert sources[1] is None  # the non-UTF-8 row is dropped, and counted, when pairs are formed


def test_clean_corpus_n_semantics():
    skips = SkipCounter()
    sources = ["a  b ", "a b c d", "x", "a b c"]
    targets = ["c d", "e", "", "d e"]
    kept = text.clean_corpus(sources, targets, skips, min_len=1, max_len=3, ratio=1.5)
    assert kept == (["a b", "a b c"], ["c d", "d e"])  # 3/2 = 1.5 is allowed, whitespace normalised
    assert skips.as_dict() == {"clean_length": 2}


@pytest.mark.slow
def test_parallel_tokenization_matches_single_process(monkeypatch):
    lines = [f"Hallo, Welt Nummer {index}!" for index in range(40)]
    step = text.Pipeline([text.MosesTokenize("de"), text.Lowercase()])
    monkeypatch.setattr(text, "MIN_LINES_PER_WORKER", 10)
    monkeypatch.setattr(text, "CHUNK_LINES", 7)
    assert text.map_lines(step, lines, workers=2) == [step(line) for line in lines]


# --- names and languages -------------------------------------------------------------------

@pytest.mark.parametrize("settings, message", [
    (dict(dataset="wmt99"), "unknown dataset 'wmt99'; choose one of iwslt14-de-en, wmt14-en-de"),
    (dict(dataset="iwslt14-de-en", source_lang="fr"), "unknown language pair fr-en for iwslt14-de-en"),
    (dict(dataset="opus-100", pairs=["de", "xx"]), "unknown language code 'xx': OPUS-100 has af am"),
    (dict(dataset="opus-100", pairs=["de-fr"]), "English-centric"),
    (dict(dataset="custom", source_lang="Deutsch", target_lang="en", train=["a", "b"]), "unknown language code 'Deutsch'"),
    (dict(dataset="sample-es-en", subword="wordpiece"), "unknown subword method 'wordpiece'"),
])
def test_unknown_names(tmp_path, settings, message):
    with pytest.raises(DataPreparationError, match=message.replace("(", r"\(")):
        prepare(PrepareOptions(out=tmp_path / "out", progress=False, **settings))


# --- the output directory ----------------------------------------------------------------------

def test_output_directory_with_other_data_then_force_then_no_op(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 40)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(DataPreparationError, match="holds other files .*--force"):
        prepare(custom_options(tmp_path, [source, target]))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"  # untouched
    with pytest.raises(DataPreparationError, match="--force replaces only those"):  # not ours: never deleted
        prepare(custom_options(tmp_path, [source, target], force=True))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    (tmp_path / "out" / "notes.txt").unlink()
    first = prepare(custom_options(tmp_path, [source, target], force=True))
    assert not first.reused
    with pytest.raises(DataPreparationError, match="holds a different preparation \\(custom, other settings\\)"):
        prepare(custom_options(tmp_path, [source, target], vocab_size=45))
    again = prepare(custom_options(tmp_path, [source, target], workers=2))  # workers do not change the data
    assert again.reused and again.manifest == first.manifest
    target.write_text(target.read_text().replace("Sentence 1 ", "Phrase 1 "))  # changed input: real work again
    with pytest.raises(DataPreparationError, match="different preparation"):
        prepare(custom_options(tmp_path, [source, target]))


def test_a_failure_late_in_the_run_leaves_no_output(tmp_path, monkeypatch):
    source, target = write_plain_pair(tmp_path / "in", 40)

    def broken_preprocess(arguments):
        raise DataPreparationError("fairseq-preprocess failed: simulated")

    monkeypatch.setattr(pipeline, "run_fairseq_preprocess", broken_preprocess)
    with pytest.raises(DataPreparationError, match="simulated"):
        prepare(custom_options(tmp_path, [source, target]))
    assert_nothing_left(tmp_path)


# --- the CLI -------------------------------------------------------------------------------------

def test_cli_prints_one_error_line_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--dataset", "nope", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: unknown dataset 'nope'; choose one of iwslt14-de-en, wmt14-en-de, opus-100, custom, sample-es-en"]


@pytest.mark.slow
def test_prepare_script_has_no_traceback_on_bad_input(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 5)
    target.write_text("one line\n")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "prepare.py"), "--dataset", "custom",
                             "--source-lang", "de", "--target-lang", "en", "--train", str(source), str(target),
                             "--out", str(tmp_path / "out"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: line counts differ:")
