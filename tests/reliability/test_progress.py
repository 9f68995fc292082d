"""Progress: long commands show progress on a terminal (or when asked), in a fixed width."""

from __future__ import annotations

from support.guarantees import write_zero_samples


def test_train_progress_bar_keeps_its_width_at_60_columns():
    import io

    from bnnexport.train import progress_bars

    stream = io.StringIO()
    bar, status = progress_bars(range(80), 0, 5, True, file=stream, ncols=60)
    for step in bar:
        if step == 40:
            status.set_description_str("loss 0.1234  acc 0.9120  π -3.21")
            bar.refresh()
            break
    lines = [s for s in stream.getvalue().replace("\x1b[A", "").split("\r") if s.strip()]
    bar_line = [s for s in lines if s.startswith("epoch 1/5")][-1]
    assert len(bar_line.split("|")[1]) >= 30, bar_line
    assert "loss" not in bar_line and any(s.startswith("loss 0.1234") for s in lines)


def test_bench_shows_progress_when_asked(trained_run, capsys):
    from bnnexport.bench import BenchOptions, bench

    write_zero_samples(trained_run)
    bench(trained_run, BenchOptions(runs=1, warmup=0, samples=4), write_report=False, progress=True)
    assert "bench" in capsys.readouterr().err
