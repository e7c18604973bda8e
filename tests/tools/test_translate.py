"""Translation from Python, the CLI, and fairseq-interactive with the plugin."""
import io
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import CLI_ENV, USER_DIR, fairseq_cli
from residual_fairseq import translate
from residual_fairseq.evaluate import evaluate_run, read_generate_output
from helpers.trained_models import MAX_LEN_B, sample_corpus_subset, toy_evaluation


@pytest.fixture(scope="module")
def toy_run(toy_data_bin):
    """(averaged checkpoint, test sources, fairseq-generate hypotheses in test-set order)."""
    _, result = toy_evaluation(toy_data_bin)
    sources = (toy_data_bin.parent / "text" / "test.src").read_text().splitlines()
    hypotheses, _ = read_generate_output(result["generate_output"])
    return result["checkpoint"], sources, hypotheses


@pytest.fixture(scope="module")
def translator(toy_run, toy_data_bin):
    return translate.load_translator(toy_run[0], toy_data_bin, cpu=True)


def test_translate_equals_fairseq_generate(toy_run, translator):
    _, sources, generated = toy_run
    assert len(set(generated[:10])) > 1, "degenerate model: the comparison would prove little"
    single = translator.translate(sources[3], beam=5, max_len_b=MAX_LEN_B)
    assert isinstance(single, str) and single == generated[3]
    batch = translator.translate(sources[:10], beam=5, max_len_b=MAX_LEN_B)
    assert batch == generated[:10]
    # Empty sentences come back empty, in place, without disturbing the others.
    assert translator.translate([sources[0], "  ", sources[1]], max_len_b=MAX_LEN_B) == [
        generated[0], "", generated[1]]


def test_fairseq_interactive_with_the_plugin_gives_the_same_translations(toy_run, toy_data_bin):
    checkpoint, sources, generated = toy_run
    proc = run_with_stdin(
        [fairseq_cli("fairseq-interactive"), toy_data_bin, "--path", checkpoint, "--user-dir", USER_DIR,
         "--beam", "5", "--max-len-b", str(MAX_LEN_B), "--cpu"],
        "\n".join(sources[:4]) + "\n",
    )
    hypotheses = [line.split("\t", 2)[2] for line in proc.stdout.splitlines() if re.match(r"H-\d+\t", line)]
    assert hypotheses == generated[:4]


def run_with_stdin(cmd, text):
    import subprocess

    from helpers import CLI_ENV

    proc = subprocess.run([str(c) for c in cmd], input=text, capture_output=True, text=True, env=CLI_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_translate_cli_reads_stdin_and_keeps_lines_aligned(toy_run, toy_data_bin, translator, monkeypatch, capsys):
    checkpoint, sources, _ = toy_run
    lines = [sources[0], "", sources[1]]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    translate.main([checkpoint, "--data", str(toy_data_bin), "--cpu", "--beam", "5"])
    assert capsys.readouterr().out.splitlines() == translator.translate(lines, beam=5)


def test_translate_cli_input_file(toy_run, toy_data_bin, translator, tmp_path, capsys):
    checkpoint, sources, _ = toy_run
    (tmp_path / "in.txt").write_text("\n".join(sources[:3]) + "\n")
    translate.main([checkpoint, "--data", str(toy_data_bin), "--cpu", "--input", str(tmp_path / "in.txt")])
    assert capsys.readouterr().out.splitlines() == translator.translate(sources[:3])


def test_translate_bad_input_is_a_one_line_error(toy_run, toy_data_bin, translator, tmp_path, monkeypatch, capsys):
    checkpoint, sources, _ = toy_run
    too_long = " ".join(["w1"] * (translator.max_source_tokens + 5))
    # A language model's checkpoint (its stored task), data of another language pair, and
    # dictionaries of sentencepiece units with no spm.model to find (raw input would be all <unk>).
    state = torch.load(checkpoint, weights_only=True)
    state["cfg"]["task"].update(source_lang="src", target_lang="tgt")  # as residual-fairseq-train stores them
    torch.save(state, tmp_path / "paired.pt")
    state["cfg"]["task"]["_name"] = "language_modeling"
    torch.save(state, tmp_path / "lm.pt")
    state["cfg"]["task"]["_name"] = "translation"
    state["cfg"]["task"]["max_source_positions"] = -5
    torch.save(state, tmp_path / "task_positions.pt")
    state["cfg"]["task"]["max_source_positions"] = 1024
    state["cfg"]["model"].max_source_positions = -5
    torch.save(state, tmp_path / "model_positions.pt")
    other_pair, pieces, run_dir = tmp_path / "de-en", tmp_path / "pieces", tmp_path / "run"
    other_pair.mkdir(), pieces.mkdir(), run_dir.mkdir()
    (run_dir / "checkpoint_last.pt").write_bytes(b"")  # a save dir without checkpoint_best.pt
    for lang, other in (("src", "de"), ("tgt", "en")):
        entries = (toy_data_bin / f"dict.{lang}.txt").read_text().splitlines()
        (other_pair / f"dict.{other}.txt").write_text("\n".join(entries) + "\n")
        (pieces / f"dict.{lang}.txt").write_text("".join(f"\u2581{entry}\n" for entry in entries))
    cases = [
        ("\n \n", [checkpoint, "--data", str(toy_data_bin)],
         "error: empty input: nothing to translate"),
        (sources[0] + "\n" + too_long + "\n", [checkpoint, "--data", str(toy_data_bin), "--cpu"],
         f"error: line 2 is {translator.max_source_tokens + 6} tokens long after tokenization and subwords "
         f"(with </s>); this model takes at most {translator.max_source_tokens}: split it"),
        (sources[0], [str(tmp_path / "missing.pt"), "--data", str(toy_data_bin)],
         f"error: checkpoint not found: {tmp_path / 'missing.pt'}"),
        (sources[0], [checkpoint, "--data", str(tmp_path)],
         f"error: no dict.<lang>.txt files in {tmp_path}"),
        (sources[0], [checkpoint, "--data", str(toy_data_bin), "--input", str(tmp_path / "nope.txt")],
         f"error: input file not found: {tmp_path / 'nope.txt'}"),
        # the long line after a full batch: refused before the first batch is printed
        ("\n".join(sources[:3]) + "\n" + too_long + "\n", [checkpoint, "--data", str(toy_data_bin), "--batch-lines", "2"],
         f"error: line 4 is {translator.max_source_tokens + 6} tokens long"),
        (sources[0], [str(tmp_path / "lm.pt"), "--data", str(toy_data_bin)],
         f"error: checkpoint {tmp_path / 'lm.pt'} is a language_modeling model, not a translation model"),
        (sources[0], [str(tmp_path / "paired.pt"), "--data", str(other_pair)],
         f"error: checkpoint {tmp_path / 'paired.pt'} translates src->tgt, but {other_pair} has no dict.src.txt"),
        (sources[0], [checkpoint, "--data", str(other_pair)],  # fairseq-train without -s/-t stores no pair
         f"error: checkpoint {checkpoint} does not name its languages, and {other_pair} holds no binarized split"),
        (sources[0], [str(tmp_path / "paired.pt"), "--data", str(pieces)],
         f"error: {pieces / 'dict.src.txt'} holds sentencepiece units, but no subword model was found in {pieces} "
         "or its parent: pass --sentencepiece-model FILE"),
        # nonsensical stored positions blame the checkpoint, not the input line (was "takes at most -5")
        (sources[0], [str(tmp_path / "task_positions.pt"), "--data", str(toy_data_bin)],
         f"error: checkpoint {tmp_path / 'task_positions.pt'} stores cfg.task.max_source_positions = -5, not a "
         "positive number of positions"),
        (sources[0], [str(tmp_path / "model_positions.pt"), "--data", str(toy_data_bin)],
         f"error: checkpoint {tmp_path / 'model_positions.pt'} stores cfg.model.max_source_positions = -5, not a "
         "positive number of positions"),
        # a directory without checkpoint_best.pt: what to give instead (was "checkpoint not found: DIR/...")
        (sources[0], [str(run_dir), "--data", str(toy_data_bin)],
         f"error: {run_dir} is a directory without checkpoint_best.pt (it holds checkpoint_last.pt): give a "
         f"checkpoint file, e.g. {run_dir / 'checkpoint_last.pt'}"),
    ]
    for stdin, argv, expected in cases:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        with pytest.raises(SystemExit) as exit_info:
            translate.main(argv)
        assert exit_info.value.code == 2
        captured = capsys.readouterr()
        assert captured.err.strip().startswith(expected) and "\n" not in captured.err.strip(), captured.err
        assert captured.out == ""  # nothing half-translated on stdout
    # From Python, the same check raises the error type, naming the sentence.
    with pytest.raises(translate.SentenceTooLongError, match="^sentence 1 is"):
        translator.translate([too_long])
    # Pieces are fine when the input is already split into them: --bpe none skips the check.
    monkeypatch.setattr("sys.stdin", io.StringIO("\u2581w1 \u2581w2\n"))
    translate.main([str(tmp_path / "paired.pt"), "--data", str(pieces), "--bpe", "none", "--beam", "1"])
    assert len(capsys.readouterr().out.splitlines()) == 1


@pytest.mark.slow
def test_sentencepiece_round_trip_on_the_sample_corpus(tmp_path_factory):
    """Raw Spanish in, raw English out: evaluation removes sentencepiece for real, and
    the Python translator (finding spm.model beside the data) agrees with it."""
    prepared, save_dir = sample_corpus_subset(tmp_path_factory.getbasetemp())
    raw_references = (prepared / "tok" / "test.en").read_text(encoding="utf-8").splitlines()
    raw_sources = (prepared / "tok" / "test.es").read_text(encoding="utf-8").splitlines()
    assert "▁" in (prepared / "test.en").read_text(encoding="utf-8")  # the binarized text was segmented

    result = evaluate_run(save_dir, prepared / "bin", subword="spm-bpe", reference=prepared / "tok" / "test.en",
                          generate_args=["--max-len-b", "20"], out_json=save_dir / "eval.json")
    hypotheses = open(result["hypotheses"], encoding="utf-8").read().splitlines()
    _, generated_references = read_generate_output(result["generate_output"])
    # Subword removal restores the raw references exactly, except where a rare
    # character (e.g. a curly apostrophe) fell outside the tiny 600-piece vocabulary.
    restored = [ref == raw for ref, raw in zip(generated_references, raw_references) if "<unk>" not in ref]
    assert len(restored) >= len(raw_references) // 2 and all(restored)
    assert hypotheses and not any("▁" in hypothesis or "  " in hypothesis for hypothesis in hypotheses)
    assert result["num_sentences"] == len(raw_references)

    translator = translate.load_translator(save_dir / "checkpoint_best.pt", prepared / "bin", cpu=True)
    assert translator.translate(raw_sources[:6], max_len_b=20) == hypotheses[:6]


@pytest.mark.parametrize("section, name, value", [
    ("generation", "sampling", True), ("generation", "temperature", 0.0), ("generation", "diverse_beam_groups", 2),
    ("generation", "constraints", "ordered"), ("generation", "min_len", 100000),
    ("generation", "max_len_a", float("nan")), ("dataset", "max_tokens", 1),
])
def test_decoding_settings_stored_in_a_checkpoint_are_not_used(toy_run, toy_data_bin, tmp_path, section, name,
                                                              value):
    """How to decode is the caller's choice: a checkpoint's stored generation settings changed
    the output (sampling) or broke every translation (a traceback from fairseq)."""
    checkpoint, sources, generated = toy_run
    state = torch.load(checkpoint, weights_only=True)
    state["cfg"][section][name] = value
    torch.save(state, tmp_path / "stored.pt")
    stored = translate.load_translator(tmp_path / "stored.pt", toy_data_bin, cpu=True)
    assert stored.translate(sources[:4], beam=5, max_len_b=MAX_LEN_B) == generated[:4]


def test_a_checkpoint_with_non_finite_weights_is_refused_on_loading(toy_run, toy_data_bin, tmp_path):
    state = torch.load(toy_run[0], weights_only=True)
    name = next(name for name in state["model"] if name.endswith("fc1.weight"))
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    torch.save(state, tmp_path / "diverged.pt")
    with pytest.raises(translate.UserError, match=f"holds NaN or infinite weights \\({re.escape(name)}\\)"):
        translate.load_translator(tmp_path / "diverged.pt", toy_data_bin, cpu=True)


@pytest.mark.parametrize("where, name, value", [
    ("task", "max_source_positions", 0), ("model", "max_source_positions", True),
    ("model", "max_target_positions", -1), ("task", "max_target_positions", "abc"),
])
def test_nonsensical_stored_positions_are_refused_naming_the_value(toy_run, toy_data_bin, tmp_path, where, name,
                                                                   value):
    """fairseq took them as the model's limit (blaming every input line) or failed building from them."""
    state = torch.load(toy_run[0], weights_only=True)
    if where == "task":
        state["cfg"]["task"][name] = value
    else:
        setattr(state["cfg"]["model"], name, value)
    torch.save(state, tmp_path / "positions.pt")
    shown = repr(value)
    with pytest.raises(translate.UserError, match=re.escape(f"stores cfg.{where}.{name} = {shown}, not a")):
        translate.load_translator(tmp_path / "positions.pt", toy_data_bin, cpu=True)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_translations_are_written_takes_effect_after_the_batch(monkeypatch, signum):
    """A batch of translations is never left half-written on stdout: a signal that arrives while it
    is written stops the command right after; one that arrives between writes stops it at once."""
    stop = translate.Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    written = []

    class SignalledStdout:
        def write(self, text):
            written.append(text[:3])
            os.kill(os.getpid(), signum)  # its Python handler runs here, before the rest is written
            written.append(text[3:])

        def flush(self):
            written.append("<flushed>")

    monkeypatch.setattr(sys, "stdout", SignalledStdout())
    previous = signal.getsignal(signum)
    with pytest.raises(stop):
        with translate.WholeLines() as output:
            output.write(["first", "second"])
    assert "".join(written) == "first\nsecond\n<flushed>" and output.lines == 2
    assert signal.getsignal(signum) is previous
    with pytest.raises(stop):
        with translate.WholeLines() as output:
            os.kill(os.getpid(), signum)
            time.sleep(5)  # interrupted by the signal's exception
    assert output.lines == 0 and signal.getsignal(signum) is previous


def test_sigterm_ends_translate_with_one_line_saying_what_stdout_holds(toy_run, toy_data_bin, translator, tmp_path):
    """SIGTERM ended translate silently (exit 143, no error line) like a crash; now it says how many
    lines were translated, and stdout holds exactly those translations, whole lines."""
    checkpoint, sources, _ = toy_run
    lines = (sources * 50)[:2000]  # minutes of decoding, one line a batch: stopped after the first lines
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen(["residual-fairseq-translate", str(checkpoint), "--data", str(toy_data_bin), "--cpu",
                             "--input", str(tmp_path / "in.txt"), "--batch-lines", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLI_ENV)
    try:
        first = proc.stdout.readline()  # decoding has begun
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    match = re.fullmatch(r"error: terminated: stdout holds the translations of the first (\d+) of 2000 lines, "
                         r"whole lines\n", err)
    assert match, err[-3000:]
    out = first + rest
    done = int(match[1])
    assert 1 <= done < 2000 and out.endswith("\n") and out.count("\n") == done
    assert out.splitlines() == translator.translate(lines[:done], beam=5)


# Run translate with its address space limited, from just before decoding: the limit leaves
# HEADROOM bytes above what the loaded model and the input take.
LIMITED_TRANSLATE = """
import resource, sys
from residual_fairseq import translate
headroom = int(sys.argv.pop(1)) << 20
check_lengths = translate.Translator.check_lengths
def check_lengths_then_limit(self, lines):
    check_lengths(self, lines)
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + headroom, resource.RLIM_INFINITY))
translate.Translator.check_lengths = check_lengths_then_limit
translate.main(sys.argv[1:])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_running_out_of_memory_while_decoding_is_one_line_with_a_hint(toy_run, toy_data_bin, tmp_path):
    """--beam 1000 (the allowed maximum) under a memory limit was a traceback from torch's allocator
    ("DefaultCPUAllocator: can't allocate memory")."""
    checkpoint, sources, _ = toy_run
    (tmp_path / "in.txt").write_text("\n".join((sources * 2)[:64]) + "\n")

    def limited(beam):
        return subprocess.run([sys.executable, "-c", LIMITED_TRANSLATE, "96", str(checkpoint), "--data",
                               str(toy_data_bin), "--cpu", "--threads", "1", "--input", str(tmp_path / "in.txt"),
                               "--beam", str(beam)], capture_output=True, text=True, env=CLI_ENV, timeout=600)

    control = limited(5)  # the limit leaves room to translate: what runs out is the beam's
    assert control.returncode == 0 and control.stdout.count("\n") == 64, control.stderr[-3000:]
    proc = limited(1000)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == ("error: out of memory translating lines 1-64 with --beam 1000 and --batch-lines 64: "
                           "try a smaller --beam or --batch-lines (nothing was written to stdout)\n")
    assert proc.stdout == ""
