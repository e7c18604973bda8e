"""Which encoding a user's text is in: a UTF-16/32 byte-order mark is believed only when the bytes after it
really are that encoding (a UTF-8 file that happens to start with FF FE stays UTF-8), in the data
pipeline's reader (data.textio) and in the tools' (argtypes.decode_user_text: translate, evaluate)."""
import pytest

from residual_fairseq import argtypes
from residual_fairseq.argtypes import decode_user_text
from residual_fairseq.data import PrepareOptions, prepare
from residual_fairseq.data.textio import read_lines
from residual_fairseq.errors import UserError
from helpers.data_builders import numbered_pair

LINES = ["Grüße aus Köln", "", "zweite Zeile ñ", "中文的句子"]
CJK_ONLY = ["中文的句子", "日本語の文"]  # no ASCII: UTF-16 without a single NUL byte besides the line ends


@pytest.mark.parametrize("encoding,lines", [("utf-16-le", LINES), ("utf-16-be", LINES), ("utf-32-le", LINES),
                                            ("utf-16-le", CJK_ONLY), ("utf-16-be", CJK_ONLY)])
def test_real_utf16_and_utf32_files_are_read_as_such(tmp_path, encoding, lines):
    mark = "\ufeff".encode(encoding)
    data = mark + "".join(line + "\n" for line in lines).encode(encoding)
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    assert read_lines(path) == lines
    assert decode_user_text(data, "text") == "".join(line + "\n" for line in lines)
    # One line of CJK text without a line end has no NUL byte at all: it still decodes as UTF-16.
    one = mark + lines[-1].encode(encoding)
    assert argtypes.text_encoding(one) == (encoding, len(mark)) and decode_user_text(one, "x") == lines[-1]


@pytest.mark.parametrize("text", ["Hola mundo\nsegunda línea\n", "ab\ncd\n", "Hola mundo\nsegunda línea\nx\n"])
def test_a_utf8_file_that_starts_with_ff_fe_stays_utf8(tmp_path, text):
    """(Before: read as UTF-16, one garbled line, or 'not UTF-16-LE text'; the corpus then had a line count
    differing from its other side.) The stray bytes make the first line undecodable, and nothing else."""
    data = b"\xff\xfe" + text.encode("utf-8")
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    expected = text.split("\n")[:-1]
    assert read_lines(path) == [None] + expected[1:]
    assert argtypes.text_encoding(data) == ("utf-8", 0)
    with pytest.raises(UserError, match=r"^text is not UTF-8 text \(line 1\): convert it to UTF-8$"):
        decode_user_text(data, "text")


def test_a_corpus_side_that_starts_with_ff_fe_pairs_up_with_its_utf8_other_side(tmp_path):
    pairs = [numbered_pair(index) for index in range(1, 41)]
    source, target = tmp_path / "corpus.de", tmp_path / "corpus.en"
    source.write_bytes(b"\xff\xfe" + "".join(pair[0] + "\n" for pair in pairs).encode("utf-8"))
    target.write_bytes("".join(pair[1] + "\n" for pair in pairs).encode("utf-8"))
    prepared = prepare(PrepareOptions(dataset="custom", out=tmp_path / "out", source_lang="de", target_lang="en",
                                      train=[source, target], valid_size=3, test_size=3, vocab_size=40,
                                      progress=False))
    assert prepared.manifest["skipped"] == {"non_utf8": 1}
    assert sum(split["pairs"] for split in prepared.manifest["splits"].values()) == 39
