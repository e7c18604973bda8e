"""The data CLI's bad-input classes (docs/reliability.md): data loss with --force, values that
cannot be meant, UTF-16/32 input, mismatched reused files, interrupted runs."""
import json
import os

import pytest

from residual_fairseq.data import DataPreparationError, PrepareOptions, prepare
from residual_fairseq.data.cli import main
from residual_fairseq.data.textio import read_lines
from helpers.data_builders import numbered_pair, write_plain_pair


def custom_options(tmp_path, train, out="out", **settings):
    settings.setdefault("vocab_size", 40)
    return PrepareOptions(dataset="custom", out=tmp_path / out, source_lang="de", target_lang="en", train=train,
                          valid_size=3, test_size=3, progress=False, **settings)


def cli_error(capsys, argv):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main([str(word) for word in argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def snapshot(directory):
    return {str(path.relative_to(directory)): path.read_bytes() for path in directory.rglob("*") if path.is_file()}


# --- data loss ----------------------------------------------------------------------------------

def test_force_never_deletes_the_runs_own_inputs(tmp_path, capsys):
    source, target = write_plain_pair(tmp_path / "indir", 30, stem="a")
    (tmp_path / "indir" / "unrelated.txt").write_text("mine")
    before = snapshot(tmp_path / "indir")
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                              "--valid-size", "3", "--test-size", "3", "--vocab-size", "40",
                              "--out", tmp_path / "indir", "--force", "--quiet"])
    assert line.startswith("error: --out") and "holds an input of this run" in line
    assert snapshot(tmp_path / "indir") == before


def test_force_replaces_only_an_earlier_preparation_and_nothing_it_did_not_write(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 30)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(DataPreparationError, match="not an earlier residual-fairseq-prepare output"):
        prepare(custom_options(tmp_path, [source, target], force=True))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    (tmp_path / "out" / "manifest.json").write_text('{"name": "some other tool"}')
    with pytest.raises(DataPreparationError, match="not an earlier residual-fairseq-prepare output"):
        prepare(custom_options(tmp_path, [source, target], force=True))
    (tmp_path / "out" / "notes.txt").unlink()
    (tmp_path / "out" / "manifest.json").unlink()

    prepare(custom_options(tmp_path, [source, target]))
    (tmp_path / "out" / "bin" / "my-notes.txt").write_text("mine")  # added by the user afterwards
    with pytest.raises(DataPreparationError, match=r"files an earlier preparation did not write \(bin/my-notes.txt\)"):
        prepare(custom_options(tmp_path, [source, target], vocab_size=45, force=True))
    (tmp_path / "out" / "bin" / "my-notes.txt").unlink()
    replaced = prepare(custom_options(tmp_path, [source, target], vocab_size=45, force=True))
    assert replaced.manifest["settings"]["vocab_size"] == 45


def test_stale_staging_folders_of_dead_processes_are_removed(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 30)
    dead = tmp_path / ".out.partial-999999999"   # no such process
    alive = tmp_path / f".out.partial-{os.getppid()}"  # a running process: maybe a concurrent run
    for folder in (dead, alive, tmp_path / ".out.old-999999999"):
        folder.mkdir()
        (folder / "big.bin").write_bytes(b"x" * 1000)
    prepare(custom_options(tmp_path, [source, target]))
    assert not dead.exists() and not (tmp_path / ".out.old-999999999").exists()
    assert (alive / "big.bin").is_file()


# --- values that cannot be meant ------------------------------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--max-len", "-1"], "argument --max-len: must be at least 1, got -1"),
    (["--length-ratio", "-1"], "argument --length-ratio: must be 0 or more, got -1"),
    (["--length-ratio", "nan"], "argument --length-ratio: must be a finite number, got nan"),
    (["--min-len", "-2"], "argument --min-len: must be at least 0, got -2"),
    (["--vocab-size", "0"], "argument --vocab-size: must be at least 1, got 0"),
    (["--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["--valid-size", "0"], "argument --valid-size: must be at least 1, got 0"),
    (["--tsv-columns", "1,1"], "--tsv-columns wants two different numbers"),
])
def test_nonsense_numbers_fail_at_parse_time(tmp_path, capsys, flags, message):
    line = cli_error(capsys, ["--dataset", "sample-es-en", "--out", tmp_path / "out", "--quiet", *flags])
    assert message in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("settings, message", [
    (dict(max_len=-1), "--max-len must be at least 1, got -1"),
    (dict(length_ratio=-1.0), "--length-ratio must be a finite number >= 1"),
    (dict(length_ratio=0.5), "--length-ratio 0.5 is below 1"),
    (dict(min_len=5, max_len=3), "--min-len 5 is above --max-len 3"),
])
def test_nonsense_numbers_fail_in_the_python_api(tmp_path, settings, message):
    source, target = write_plain_pair(tmp_path / "in", 20)
    with pytest.raises(DataPreparationError, match=message):
        prepare(custom_options(tmp_path, [source, target], **settings))


def test_cleaning_that_leaves_nothing_to_train_on_is_an_error(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 30)
    # Every numbered pair has more than 2 subword tokens after segmentation: nothing survives.
    with pytest.raises(DataPreparationError, match=r"no (train|valid|test) pairs left after cleaning \(min/max length "
                       r"1/2, length ratio 1.5; \d+ dropped: \d+ too short or too long\): loosen the limits"):
        prepare(custom_options(tmp_path, [source, target], subword="spm-bpe", max_len=2))
    assert not (tmp_path / "out").exists()


# --- text encodings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-8-sig"])
def test_byte_order_marked_files_are_decoded(tmp_path, encoding):
    lines = ["Grüße aus Köln", "", "zweite Zeile ñ"]
    path = tmp_path / "text.txt"
    data = "".join(line + "\n" for line in lines).encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    path.write_bytes(data)
    assert read_lines(path) == lines


def test_utf16_corpus_prepares_like_its_utf8_copy(tmp_path):
    pairs = [numbered_pair(index) for index in range(1, 31)]
    for name, encoding in (("utf8", "utf-8"), ("utf16", "utf-16")):
        for side, lang in ((0, "de"), (1, "en")):
            text = "".join(pair[side] + "\n" for pair in pairs)
            (tmp_path / f"{name}.{lang}").write_bytes(text.encode(encoding))
    reference = prepare(custom_options(tmp_path, [tmp_path / "utf8.de", tmp_path / "utf8.en"], out="a"))
    wide = prepare(custom_options(tmp_path, [tmp_path / "utf16.de", tmp_path / "utf16.en"], out="b"))
    assert wide.manifest["skipped"] == {} and wide.manifest["splits"] == reference.manifest["splits"]
    assert (wide.out_dir / "tok" / "train.de").read_text() == (reference.out_dir / "tok" / "train.de").read_text()


# --- things that do not fit together --------------------------------------------------------------

def test_reused_files_of_the_wrong_kind(tmp_path, capsys):
    source, target = write_plain_pair(tmp_path / "in", 20)
    base = ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target, "--valid-size", "3",
            "--test-size", "3", "--quiet"]
    not_a_dict = tmp_path / "dict.txt"
    not_a_dict.write_text("hello world and more\n")
    assert "is not a fairseq dictionary: line 1" in cli_error(
        capsys, base + ["--out", tmp_path / "o1", "--srcdict", not_a_dict, "--tgtdict", not_a_dict])
    codes = tmp_path / "bpe.codes"
    codes.write_text("#version: 0.2\nthis is not a merge line\n")
    assert "is not a subword-nmt codes file: line 2" in cli_error(
        capsys, base + ["--out", tmp_path / "o2", "--subword-model", codes])
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"\x00garbage" * 10)
    assert "is not a sentencepiece model" in cli_error(capsys, base + ["--out", tmp_path / "o3", "--subword-model", spm])
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"version": 3, "files": ["a"]}))
    assert "is not one residual-fairseq-prepare wrote" in cli_error(capsys, base + ["--out", tmp_path / "o4", "--reuse", other])
    (other / "manifest.json").write_text("[1, 2]")
    assert "is not a readable manifest" in cli_error(capsys, base + ["--out", tmp_path / "o5", "--reuse", other])
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))


# --- hostile reused files, odd names, aligned splits (found by red-teaming the CLI) ---------------

def test_dictionaries_fairseqs_parser_refuses_are_one_line(tmp_path, capsys):
    """The line format is not enough: fairseq refuses duplicate symbols and its own specials."""
    source, target = write_plain_pair(tmp_path / "in", 20)
    good = "".join(f"w{i} {100 - i}\n" for i in range(20))
    cases = {"duplicate": good + "w3 1\n", "special": "<unk> 5\n" + good, "superscript-count": good + "foo \u00b2\n"}
    for name, text in cases.items():
        dictionary = tmp_path / f"{name}.txt"
        dictionary.write_text(text, encoding="utf-8")
        line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                                  "--valid-size", "3", "--test-size", "3", "--subword", "none", "--quiet",
                                  "--srcdict", dictionary, "--tgtdict", dictionary, "--out", tmp_path / name])
        assert line.startswith(f"error: --srcdict {dictionary} is not a fairseq dictionary: "), line
        assert not (tmp_path / name).exists()


def test_a_codes_file_whose_version_line_subword_nmt_cannot_parse(tmp_path, capsys):
    source, target = write_plain_pair(tmp_path / "in", 20)
    codes = tmp_path / "bpe.codes"
    codes.write_text("#version: abc\nS a\n")
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                              "--valid-size", "3", "--test-size", "3", "--quiet", "--subword-model", codes,
                              "--out", tmp_path / "out"])
    assert line == f"error: subword model {codes} is not a subword-nmt codes file: line 1 is not '#version: X.Y'"


def test_a_vocabulary_size_sentencepiece_cannot_take_is_one_line(tmp_path, capsys):
    source, target = write_plain_pair(tmp_path / "in", 20)
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                              "--valid-size", "3", "--test-size", "3", "--quiet", "--vocab-size", "1000000000000",
                              "--out", tmp_path / "out"])
    assert line.startswith("error: sentencepiece could not learn a 1000000000000 vocabulary")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("code", ["de\n", "de\r", "de/x", "../de"])
def test_a_language_code_with_a_line_end_or_a_path_is_refused(tmp_path, capsys, code):
    source, target = write_plain_pair(tmp_path / "in", 20)
    line = cli_error(capsys, ["--dataset", "custom", "-s", code, "-t", "en", "--train", source, target,
                              "--quiet", "--out", tmp_path / "out"])
    assert line == f"error: unknown language code {code!r}: use an ISO 639 code such as de or pt_BR"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("change", [
    {"subword": None}, {"subword": "x"}, {"subword": {"method": "bpe", "model": 5}},
    {"subword": {"method": "bpe", "model": "../bpe.codes"}}, {"subword": {"method": "bpe", "model": "/etc/passwd"}},
    {"source_lang": ["de"]}, {"target_lang": "en\n"},
])
def test_a_planted_manifest_with_the_wrong_types_is_not_reused(tmp_path, capsys, change):
    """--reuse DIR reads DIR/manifest.json: values of another type, or a subword model outside DIR, are refused."""
    source, target = write_plain_pair(tmp_path / "in", 30)
    prepared = prepare(custom_options(tmp_path, [source, target], out="first")).out_dir
    manifest = json.loads((prepared / "manifest.json").read_text())
    (prepared / "manifest.json").write_text(json.dumps({**manifest, **change}))
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                              "--valid-size", "3", "--test-size", "3", "--quiet", "--reuse", prepared,
                              "--out", tmp_path / "second"])
    assert line == (f"error: --reuse {prepared}: its manifest.json is not one residual-fairseq-prepare wrote "
                    "(format/source_lang/target_lang/subword/files missing or malformed)")
    assert not (tmp_path / "second").exists()


def test_force_never_deletes_a_symlink_the_user_put_in_the_output(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 30)
    prepared = prepare(custom_options(tmp_path, [source, target])).out_dir
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    (prepared / "my-link").symlink_to(tmp_path / "mine", target_is_directory=True)
    with pytest.raises(DataPreparationError, match=r"files an earlier preparation did not write \(my-link"):
        prepare(custom_options(tmp_path, [source, target], vocab_size=45, force=True))
    assert (prepared / "my-link").is_symlink() and (prepared / "my-link" / "notes.txt").read_text() == "keep"


@pytest.mark.parametrize("subword", ["none", "bpe"])
def test_a_carriage_return_inside_a_line_keeps_the_sides_aligned(tmp_path, subword):
    """fairseq reads text with universal newlines: a lone \\r inside a valid/test line must not become
    a line end on one side only (the pair count of the binarized sides would differ)."""
    from residual_fairseq.data.binarized import check_mmap_split

    source, target = write_plain_pair(tmp_path / "in", 40)
    valid_source, valid_target = write_plain_pair(tmp_path / "valid", 10, stem="valid")
    lines = valid_source.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b" ", b"\r", 1)
    valid_source.write_bytes(b"\n".join(lines))
    result = prepare(PrepareOptions(dataset="custom", out=tmp_path / "out", source_lang="de", target_lang="en",
                                    train=[source, target], valid=[valid_source, valid_target], test_size=3,
                                    subword=subword, vocab_size=40, progress=False))
    pairs = result.manifest["splits"]["valid"]["pairs"]
    sizes = {lang: check_mmap_split(result.bin_dir / f"valid.de-en.{lang}", 10 ** 6) for lang in ("de", "en")}
    assert sizes == {"de": pairs, "en": pairs} and pairs == 10


@pytest.mark.slow
def test_quiet_prints_only_the_result(tmp_path, capsys):
    """--quiet: no info lines, no fairseq-preprocess lines, no subword-nmt bar; prepare.log keeps the info."""
    source, target = write_plain_pair(tmp_path / "in", 30)
    capsys.readouterr()
    main([str(word) for word in ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                                 "--valid-size", "3", "--test-size", "3", "--subword", "bpe", "--vocab-size", "40",
                                 "--out", tmp_path / "out", "--quiet"]])
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == f"{tmp_path / 'out' / 'bin'}\n"
    assert "learning bpe subwords" in (tmp_path / "out" / "prepare.log").read_text()


@pytest.mark.slow
def test_an_interrupted_fairseq_preprocess_leaves_no_worker_processes(tmp_path, monkeypatch):
    """fairseq-preprocess (--workers N) never terminates its pools; Ctrl-C must not leave them running."""
    import multiprocessing
    import time

    from fairseq_cli import preprocess

    from residual_fairseq.data.binarize import run_fairseq_preprocess

    def interrupted_while_binarizing(args):
        pool = multiprocessing.Pool(1)  # as fairseq's FileBinarizer does
        pool.apply_async(time.sleep, (120,))
        raise KeyboardInterrupt

    monkeypatch.setattr(preprocess, "main", interrupted_while_binarizing)
    with pytest.raises(KeyboardInterrupt):
        run_fairseq_preprocess(["--destdir", str(tmp_path)])
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert multiprocessing.active_children() == []


# --- damaged compressed data (round 3) --------------------------------------------------------------

def _gzip_damaged(data, how):
    """gzip bytes made truncated, corrupt in the deflate stream (zlib.error: an invalid block type in the
    first block's header, right after gzip's 10-byte header) or with a wrong CRC (gzip.BadGzipFile)."""
    if how == "truncated":
        return data[: len(data) // 2]
    damaged = bytearray(data)
    if how == "deflate":
        damaged[10] |= 0b110  # BTYPE 11: "invalid block type"
    else:
        damaged[-8] ^= 0xFF   # the CRC-32 of the trailer
    return bytes(damaged)


@pytest.mark.parametrize("how", ["truncated", "deflate", "crc"])
def test_a_damaged_gzip_corpus_is_one_line_naming_the_file(tmp_path, capsys, how):
    import gzip

    pairs = "".join("\t".join(numbered_pair(index)) + "\n" for index in range(1, 301))
    corpus = tmp_path / "corpus.tsv.gz"
    corpus.write_bytes(_gzip_damaged(gzip.compress(pairs.encode()), how))
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", corpus,
                              "--out", tmp_path / "out", "--quiet"])
    assert line.startswith("error: cannot read ") and f"{corpus}: corrupt or truncated" in line
    assert not (tmp_path / "out").exists()


def _repack(archive, suffix, how):
    """The members of the IWSLT test archive in a .tgz/.tar.xz/.zip, damaged in its compressed data."""
    import io
    import lzma
    import tarfile
    import zipfile

    with tarfile.open(archive) as bundle:
        members = {member.name: bundle.extractfile(member).read() for member in bundle if member.isfile()}
    path = archive.with_name("damaged" + suffix)
    if suffix == ".zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name, data in members.items():
                bundle.writestr(name, data)
        with zipfile.ZipFile(path) as bundle:
            first = bundle.infolist()[0]
        damaged = bytearray(path.read_bytes())
        data_start = first.header_offset + 30 + len(first.filename.encode()) + len(first.extra)
        damaged[data_start] |= 0b110  # the member's deflate stream: an invalid block type
        path.write_bytes(bytes(damaged))
        return path
    # A last member large enough that the damage lies past the first headers, which tarfile reads on opening.
    members["de-en/zz-notes.txt"] = "".join(f"note {index}\n" for index in range(20000)).encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as bundle:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            bundle.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    if suffix == ".tgz":
        import gzip

        compressed = bytearray(gzip.compress(raw))
        if how == "truncated":
            compressed = compressed[: len(compressed) * 2 // 3]
        else:  # a wrong CRC: tarfile stops at the tar end marker, before gzip checks it
            compressed[-8] ^= 0xFF
    else:
        compressed = bytearray(lzma.compress(raw))
        if how == "truncated":
            compressed = compressed[: len(compressed) * 2 // 3]
        else:  # a flipped byte late in the block: xz's "Corrupt input data" (lzma.LZMAError) while unpacking
            compressed[len(compressed) * 3 // 4] ^= 0xFF
    path.write_bytes(bytes(compressed))
    return path


@pytest.mark.parametrize("suffix,how", [(".tgz", "truncated"), (".tgz", "corrupt"), (".tar.xz", "truncated"),
                                        (".tar.xz", "corrupt"), (".zip", "corrupt")])
def test_a_damaged_archive_is_one_line_naming_the_file(tmp_path, capsys, suffix, how):
    from helpers.data_builders import build_iwslt_archive

    damaged = _repack(build_iwslt_archive(tmp_path / "de-en.tgz"), suffix, how)
    line = cli_error(capsys, ["--dataset", "iwslt14-de-en", "--from-archive", damaged, "--out", tmp_path / "out",
                              "--quiet"])
    assert f"archive {damaged} is corrupt or truncated" in line, line
    assert not (tmp_path / "out").exists()


# --- messages that say what is wrong (round 3) -------------------------------------------------------

def test_tsv_columns_the_file_does_not_have_say_how_many_it_has(tmp_path, capsys):
    corpus = tmp_path / "two.tsv"
    corpus.write_text("".join("\t".join(numbered_pair(index)) + "\n" for index in range(1, 41)), "utf-8")
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", corpus,
                              "--tsv-columns", "5,6", "--out", tmp_path / "out", "--quiet"])
    assert line == (f"error: TSV file {corpus} has 2 tab-separated column(s) per row, but --tsv-columns 5,6 "
                    "asks for columns 5 and 6 (counted from 0): no row has them")


@pytest.mark.parametrize("side", [0, 1])
def test_a_side_of_only_empty_lines_is_named(tmp_path, capsys, side):
    source, target = write_plain_pair(tmp_path / "in", 40)
    empty = (source, target)[side]
    empty.write_text("\n" * 40)
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", source, target,
                              "--out", tmp_path / "out", "--quiet"])
    assert line == f"error: no pair left of {source} and {target}: {empty} has only empty lines (all 40 lines)"


def test_a_tsv_column_of_only_empty_fields_is_named(tmp_path, capsys):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{numbered_pair(index)[0]}\t \n" for index in range(1, 41)), "utf-8")
    line = cli_error(capsys, ["--dataset", "custom", "-s", "de", "-t", "en", "--train", corpus,
                              "--out", tmp_path / "out", "--quiet"])
    assert line == (f"error: no pair left of {corpus} column 0 and {corpus} column 1: {corpus} column 1 has only "
                    "empty lines (all 40 lines)")


def test_too_few_pairs_to_hold_out_says_what_was_dropped(tmp_path):
    source, target = write_plain_pair(tmp_path / "in", 5, extra=[(b"", b"x")] * 8 + [(b"\xff", b"y")] * 2)
    with pytest.raises(DataPreparationError) as refused:
        prepare(custom_options(tmp_path, [source, target]))
    assert str(refused.value).startswith("corpus has 5 pairs (after reading: 10 dropped: 8 with an empty side, "
                                         "2 not UTF-8): too few to hold out 3 valid + 3 test")


# --- a repeated input is refused, never silently used twice or once (round 3) ---------------------

@pytest.mark.parametrize("case", ["sides", "train_and_valid", "valid_and_test", "link"])
def test_the_same_file_given_twice_is_refused(tmp_path, capsys, case):
    source, target = write_plain_pair(tmp_path / "in", 40)
    held = write_plain_pair(tmp_path / "held", 10, stem="held")
    link = tmp_path / "in" / "link.en"
    link.symlink_to(target)
    train = {"sides": [source, source], "link": [source, target]}.get(case, [source, target])
    valid = {"train_and_valid": [source, held[1]], "link": [held[0], link]}.get(case, list(held))
    test = {"valid_and_test": list(held)}.get(case, [])
    argv = ["--dataset", "custom", "-s", "de", "-t", "en", "--train", *train, "--valid", *valid,
            "--out", tmp_path / "out", "--quiet"] + (["--test", *test] if test else [])
    line = cli_error(capsys, argv)
    expected = {"sides": f"{source} is given as --train source and as --train target",
                "train_and_valid": f"{source} is given as --train source and as --valid source",
                "valid_and_test": f"{held[0]} is given as --valid source and as --test source",
                "link": f"{link} is given as --train target and as --valid target"}[case]
    assert line == f"error: {expected}: give each file once"


def test_a_repeated_archive_or_opus_pair_is_refused(tmp_path, capsys):
    from helpers.data_builders import build_iwslt_archive

    archive = build_iwslt_archive(tmp_path / "de-en.tgz")
    line = cli_error(capsys, ["--dataset", "iwslt14-de-en", "--from-archive", archive, archive,
                              "--out", tmp_path / "out", "--quiet"])
    assert line == f"error: {archive} is given twice to --from-archive: give each file once"
    line = cli_error(capsys, ["--dataset", "opus-100", "--pairs", "de,fr,en-de", "--out", tmp_path / "out"])
    assert line == "error: --pairs names de twice (de,fr,en-de): give each pair once"
    line = cli_error(capsys, ["--dataset", "sample-es-en", "--from-archive", tmp_path, tmp_path / "in",
                              "--out", tmp_path / "out"])
    assert line == "error: sample-es-en reads one --from-archive directory (the sample's), got 2"


@pytest.mark.parametrize("flags,message", [
    (["--out", "a", "--out", "b"], "argument --out: given twice with different values (--out a, then --out b)"),
    (["--out", "a", "-s", "de", "--source-lang", "fr"],
     "argument --source-lang/-s: given twice with different values (-s de, then --source-lang fr)"),
    (["--out", "a", "--lowercase", "--no-lowercase"],
     "argument --lowercase/--no-lowercase: given twice with different values (--lowercase, then --no-lowercase)"),
    (["--out", "a", "--vocab-size", "8000", "--vocab-size", "4000"], "argument --vocab-size: given twice"),
])
def test_an_option_given_twice_with_different_values_is_refused(tmp_path, capsys, flags, message):
    """(Before: argparse kept the last value and dropped the first without a word.)"""
    line = cli_error(capsys, ["--dataset", "custom", *flags])
    assert line.startswith(f"residual-fairseq-prepare: error: {message}") and line.endswith(": give it once")


def test_an_option_given_twice_with_the_same_value_is_accepted():
    from residual_fairseq.data.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["--dataset", "custom", "--out", "a", "--out", "a", "--quiet", "--quiet"])
    assert (str(args.out), args.quiet) == ("a", True)
    assert str(parser.parse_args(["--dataset", "custom", "--out", "b"]).out) == "b"  # a parser parses again
