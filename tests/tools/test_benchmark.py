"""The benchmark CLI at a tiny size: every row present, every number positive and finite.

No timing assertions: the numbers are only checked to be sane, never compared.
"""
import json
import math

import pytest

from residual_fairseq.benchmark import main
from residual_fairseq.benchmark.speed import check_targets, schedule, summarize
from residual_fairseq.variants import VARIANTS


@pytest.mark.slow
def test_speed_benchmark_reports_every_variant(toy_data_bin, tmp_path, capsys):
    out_json, out_md = tmp_path / "speed.json", tmp_path / "speed.md"
    main([
        "speed", "--data", str(toy_data_bin), "--sizes", "tiny:1", "--repeats", "1",
        "--warmup", "1", "--updates", "1", "--decode-sentences", "4", "--decode-batch-size", "4",
        "--threads", "1", "--json", str(out_json), "--markdown", str(out_md),
    ])
    table = capsys.readouterr().out
    for variant in VARIANTS:
        assert any(line.startswith("tiny") and f" {variant} " in line for line in table.splitlines())
    assert len([line for line in table.splitlines() if line.strip().startswith(("PASS", "FAIL"))]) == 3

    report = json.loads(out_json.read_text())
    assert [r["variant"] for r in report["rows"]] == list(VARIANTS)
    for run in report["runs"]:
        for metric in ("train_tokens_per_s", "peak_memory_mib", "decode_sentences_per_s"):
            assert math.isfinite(run[metric]) and run[metric] > 0, (run["variant"], metric, run[metric])
        assert run["decode_sentences"] >= 4
    baseline = report["rows"][0]
    assert baseline["train_tokens_per_s_ratio"]["median"] == 1.0
    markdown = out_md.read_text()
    assert markdown.count("| tiny | 1 |") == len(VARIANTS) and "residual-fairseq-benchmark speed" in markdown


@pytest.mark.slow
def test_depth_benchmark_reports_every_depth_and_variant(toy_data_bin, tmp_path, capsys):
    out_json = tmp_path / "depth.json"
    main([
        "depth", "--data", str(toy_data_bin), "--depths", "1,2", "--width", "16", "--updates", "4",
        "--warmup-updates", "2", "--valid-batches", "1", "--threads", "1", "--json", str(out_json),
    ])
    table = capsys.readouterr().out
    rows = json.loads(out_json.read_text())["rows"]
    assert [(r["layers"], r["variant"]) for r in rows] == [(d, v) for d in (1, 2) for v in VARIANTS]
    for row in rows:
        for key in ("start_loss", "final_loss", "valid_loss"):
            assert math.isfinite(row[key]) and row[key] > 0, (row, key)
        assert row["updates"] == 4 and isinstance(row["diverged"], bool)
        assert f"{row['final_loss']:.3f}" in table


@pytest.mark.slow
def test_depth_benchmark_log_interval_reports_the_loss_along_the_way(toy_data_bin, tmp_path, capsys):
    """--log-interval N prints each run's training loss every N updates, so a run cut short
    by a time limit still shows how far it got; the last report is the loss the row ends on."""
    main(["depth", "--data", str(toy_data_bin), "--depths", "1", "--variants", "resi_dual", "--width", "16",
          "--updates", "4", "--warmup-updates", "1", "--valid-batches", "1", "--threads", "1",
          "--log-interval", "2", "--json", str(tmp_path / "d.json")])
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if ": update " in line]
    assert [line.split(": update ")[1].split()[0] for line in lines] == ["2", "4"]
    assert all(line.startswith("seed 1 L1 resi_dual: update ") for line in lines)
    row = json.loads((tmp_path / "d.json").read_text())["rows"][0]
    assert lines[-1].endswith(f"loss {row['final_loss']:.3f}")  # 4 updates: the last tenth is the last one


@pytest.mark.slow
def test_depth_benchmark_over_seeds_reports_mean_and_std(toy_data_bin, tmp_path, capsys):
    """--seeds runs the whole matrix per seed; each seed's runs equal a single --seed run
    (the seed fixes batches and initialisation), and the summary is their mean ± std."""
    tiny = ["depth", "--data", str(toy_data_bin), "--depths", "1", "--variants", "post_ln,resi_dual",
            "--width", "16", "--updates", "3", "--warmup-updates", "1", "--valid-batches", "1", "--threads", "1"]
    main([*tiny, "--seeds", "1,2", "--json", str(tmp_path / "seeds.json")])
    table = capsys.readouterr().out
    main([*tiny, "--seed", "2", "--json", str(tmp_path / "seed2.json")])
    rows = json.loads((tmp_path / "seeds.json").read_text())["rows"]
    single = json.loads((tmp_path / "seed2.json").read_text())["rows"]
    assert [(r["seed"], r["variant"]) for r in rows] == [(1, "post_ln"), (1, "resi_dual"),
                                                          (2, "post_ln"), (2, "resi_dual")]
    assert [r["valid_loss"] for r in rows[2:]] == [r["valid_loss"] for r in single]
    assert rows[0]["valid_loss"] != rows[2]["valid_loss"]
    for variant in ("post_ln", "resi_dual"):
        losses = [r["valid_loss"] for r in rows if r["variant"] == variant]
        mean, std = sum(losses) / 2, abs(losses[0] - losses[1]) / math.sqrt(2)
        assert f"{mean:.3f} ± {std:.3f}" in table
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny, "--seeds", "1,x"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--seeds '1,x': expected distinct integers from 0 to 2147483647, e.g. 1,2,3")


def test_ratios_are_paired_within_repeats_and_targets_judge_resi_dual():
    runs = []
    for repeat, drift in enumerate((1.0, 0.5)):  # the machine got twice as slow in repeat 2
        for variant, speed, memory in (("post_ln", 100, 100), ("pre_ln", 100, 100), ("resi_dual", 98, 110)):
            runs.append({"variant": variant, "preset": "p", "layers": 6, "repeat": repeat,
                         "parameters": 1, "train_tokens_per_s": speed * drift,
                         "peak_memory_mib": memory, "decode_sentences_per_s": speed * drift})
    rows = summarize(runs, ["post_ln", "pre_ln", "resi_dual"])
    resi = rows[2]
    assert resi["train_tokens_per_s_ratio"]["min"] == pytest.approx(0.98)
    assert resi["train_tokens_per_s_ratio"]["max"] == pytest.approx(0.98)
    verdicts = {c["metric"]: c["passed"] for c in check_targets(rows)}
    assert verdicts == {"train_tokens_per_s": True, "decode_sentences_per_s": True, "peak_memory_mib": False}


def test_schedule_rotates_the_variant_order():
    n = len(VARIANTS)
    plan = list(schedule([("p", 6)], list(VARIANTS), n))
    firsts = [plan[i * n][3] for i in range(n)]
    assert sorted(firsts) == sorted(VARIANTS)


def test_bad_data_dir_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["speed", "--data", str(tmp_path / "missing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: --data")


@pytest.mark.parametrize("argv, error", [
    (["speed", "--seed", "99999999999999999999999"], "argument --seed: must be at most 2147483647"),
    (["depth", "--seeds", "1,99999999999999999999"], "--seeds '1,99999999999999999999': expected distinct integers"),
    (["depth", "--seeds", "1,01"], "error: --seeds '1,01': 1 is given twice; give each once"),
    (["depth", "--depths", "1,1"], "error: --depths '1,1': 1 is given twice; give each once"),
    (["speed", "--variants", "resi_dual,resi_dual"],
     "error: --variants 'resi_dual,resi_dual': resi_dual is given twice; give each once"),
    # Issue 38: models that cannot fit grew until the machine ran out; refused before any is built.
    (["speed", "--sizes", "vaswani_wmt_en_de_big:1000", "--device", "cpu"],
     "error: a 1000+1000-layer model of width 1024 needs about"),
    (["depth", "--depths", "1000", "--width", "4096", "--device", "cpu"],
     "error: a 1000+1000-layer model of width 4096 needs about"),
    (["speed", "--sizes", "iwslt_de_en:6,iwslt_de_en:06"],
     "error: --sizes 'iwslt_de_en:6,iwslt_de_en:06': iwslt_de_en:6 is given twice; give each once"),
    (["speed", "--json", "{data}/dict.en.txt"], "error: --json {data}/dict.en.txt is in --data {data}: write it "
                                                  "outside the data directory"),
    (["speed", "--markdown", "{data}/../data/new.md"], "error: --markdown {data}/../data/new.md is in --data {data}"),
    (["speed", "--json", "{tmp}/link.txt"], "error: --json {tmp}/link.txt is in --data {data}"),
    (["speed", "--json", "{tmp}/same.out", "--markdown", "{tmp}/./same.out"],
     "error: --json {tmp}/same.out and --markdown {tmp}/./same.out are one file: give two file names"),
])
def test_bad_seeds_repeats_and_outputs_are_refused_before_anything_runs(tmp_path, capsys, argv, error):
    """Seeds numpy cannot take, a depth/variant/seed given twice (run twice, two rows of one
    setting), and --json/--markdown that would overwrite the data or each other: one line
    each, and nothing written (the data directory is never touched)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "dict.en.txt").write_text("hello 1\n")
    (data / "dict.de.txt").write_text("hallo 1\n")
    (tmp_path / "link.txt").symlink_to(data / "dict.en.txt")
    places = {"data": data, "tmp": tmp_path}
    with pytest.raises(SystemExit) as exit_info:
        main([word.format(**places) for word in argv] + ["--data", str(data)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert error.format(**places) in err[-1] and "Traceback" not in "\n".join(err)
    assert (data / "dict.en.txt").read_text() == "hello 1\n" and sorted(p.name for p in data.iterdir()) == [
        "dict.de.txt", "dict.en.txt"]
    assert not (tmp_path / "same.out").exists()


def test_only_the_known_noise_is_kept_off_the_output(toy_data_bin, tmp_path, capsys, caplog):
    """Issue 38: fairseq's INFO lines between the rows and two torch deprecation warnings from inside
    fairseq were printed on every run. Exactly those are hidden (never a blanket filter)."""
    import logging
    import warnings

    from residual_fairseq.benchmark.quiet import quiet_known_noise

    level_before = logging.getLogger("fairseq").level  # other tools' in-process runs may have set it
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with quiet_known_noise():
            warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                          "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning)
            warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. Use same type "
                          "for both instead.")
            warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated.", FutureWarning)  # not ours
            warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated.", RuntimeWarning)
            logging.getLogger("fairseq.tasks.translation").info("[en] dictionary: 8 types")
            logging.getLogger("fairseq.tasks.translation").warning("a fairseq warning")
    assert [str(w.message) for w in shown] == ["`torch.cuda.amp.GradScaler(args...)` is deprecated.",
                                               "Support for mismatched key_padding_mask and attn_mask is deprecated."]
    assert logging.getLogger("fairseq").level == level_before  # restored
    caplog.set_level(logging.INFO)
    main(["depth", "--data", str(toy_data_bin), "--depths", "1", "--width", "16", "--updates", "2",
          "--warmup-updates", "1", "--valid-batches", "1", "--threads", "1", "--variants", "resi_dual"])
    assert not [r for r in caplog.records if r.name.startswith("fairseq") and r.levelno < logging.WARNING]
    assert "dictionary:" not in capsys.readouterr().err


def test_the_stopwatch_times_cuda_work_by_cuda_events_and_cpu_work_by_the_host_clock(monkeypatch):
    """On CUDA the measured seconds are the device's: the elapsed time between two CUDA events
    recorded around the block (here a stand-in device says 1,500 ms while the host waits ~0),
    after synchronizing before and after; on CPU, perf_counter."""
    import time

    import torch
    from residual_fairseq.benchmark.speed import Stopwatch

    calls = []

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = None

        def record(self):
            calls.append("record")
            self.at = len(calls)

        def elapsed_time(self, end):
            assert end.at > self.at
            return 1500.0

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    with Stopwatch(torch.device("cuda")) as watch:
        calls.append("work")
    assert calls == ["sync", "record", "work", "record", "sync"]
    assert watch.seconds == 1.5 and watch.method == "cuda events" and watch.wall_seconds < 1.0
    with Stopwatch(torch.device("cpu")) as watch:
        time.sleep(0.05)
    assert watch.method == "perf_counter" and watch.seconds == watch.wall_seconds >= 0.05


def test_no_warmup_starts_at_the_peak_and_decays_as_after_warm_up():
    """The depth benchmark's schedule against fairseq's inverse_sqrt written out: with warm-up a
    linear ramp to the peak at update W, then sqrt(W / t); without it (the paper's ablation, as
    reproduce --no-warmup runs fairseq) the peak from the first update, then the same decay. A
    warm-up of 0 updates is refused (it trained at lr 0: sqrt(0 / t))."""
    from residual_fairseq.benchmark.depth import inverse_sqrt_schedule
    from residual_fairseq.errors import UserError

    warm, cold = inverse_sqrt_schedule(4), inverse_sqrt_schedule(4, warmup=False)
    assert [warm(update) for update in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, (4 / 5) ** 0.5, (4 / 6) ** 0.5])
    assert [cold(update) for update in range(6)] == pytest.approx([1.0, 1.0, 1.0, 1.0, (4 / 5) ** 0.5, (4 / 6) ** 0.5])
    with pytest.raises(UserError, match="--warmup-updates must be at least 1"):
        inverse_sqrt_schedule(0)


def test_depth_benchmark_refuses_a_warm_up_of_zero_updates(tmp_path, capsys):
    from helpers import user_error

    line = user_error(capsys, main, ["depth", "--data", tmp_path, "--depths", "1", "--warmup-updates", "0"])
    assert "--warmup-updates" in line


@pytest.mark.slow
def test_depth_benchmark_no_warmup_trains_at_the_peak_from_the_start(toy_data_bin, tmp_path, capsys):
    """--no-warmup: the record and the table say so, and the first update's loss change differs
    from the warm-up run's (its first step is taken at the peak rate, not a quarter of it)."""
    tiny = ["depth", "--data", str(toy_data_bin), "--depths", "1", "--variants", "post_ln", "--width", "16",
            "--updates", "3", "--warmup-updates", "4", "--valid-batches", "1", "--threads", "1"]
    main([*tiny, "--no-warmup", "--json", str(tmp_path / "cold.json")])
    table = capsys.readouterr().out
    main([*tiny, "--json", str(tmp_path / "warm.json")])
    cold, warm = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("cold", "warm"))
    assert cold["settings"]["warmup"] is False and warm["settings"]["warmup"] is True
    assert "no warm-up (the peak rate for the first 4 updates, then inverse_sqrt decay)" in table
    assert cold["rows"][0]["start_loss"] == warm["rows"][0]["start_loss"]  # same model, same first batch
    assert cold["rows"][0]["final_loss"] != warm["rows"][0]["final_loss"]
