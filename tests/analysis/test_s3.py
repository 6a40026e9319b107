"""The analysis tools on S3: moto's S3 server on 127.0.0.1, s3fs as the client, through the Trial API.

The hook writes the run and its TensorBoard summaries straight to S3 (where an object cannot grow, each
flush is a further object); the CLI reads the run from S3 in subprocesses.
"""

import json
import os
import socket
import time

import pytest
from conftest import SAVE_INTERVAL, TRAIN_STEPS, train

from smdebug import plugins

LOSS = "CrossEntropyLoss_output_0"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bucket():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    saved = dict(os.environ)
    os.environ.update(  # read by botocore under s3fs, and inherited by the CLI subprocesses
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    )
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("analysis-bucket")
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


@pytest.fixture(scope="module")
def s3_run(bucket):
    plugins.reset()
    train("s3://analysis-bucket/run", export_tensorboard=True)
    plugins.reset()
    return "s3://analysis-bucket/run"


def _download(fs, prefix, dest):
    dest.mkdir(parents=True, exist_ok=True)
    names = sorted(fs.find(prefix))
    for key in names:
        (dest / key.rsplit("/", 1)[1]).write_bytes(fs.cat_file(key))
    return names


def test_hook_tensorboard_export_to_s3(bucket, s3_run, tb, tmp_path):
    from smdebug.trials import create_trial

    trial = create_trial(s3_run)
    objects = _download(bucket, "analysis-bucket/run/tensorboard/TRAIN", tmp_path / "TRAIN")
    assert len(objects) > 1  # one object per flush, read by TensorBoard as one run
    read = tb(tmp_path / "TRAIN")
    assert [s for s, _ in read["scalars"][LOSS]] == list(range(0, TRAIN_STEPS, SAVE_INTERVAL))
    assert [v for _, v in read["scalars"][LOSS]] == pytest.approx(
        [float(trial.tensor(LOSS).value(s)) for s in range(0, TRAIN_STEPS, SAVE_INTERVAL)]
    )
    assert [s for s, _ in read["scalars"]["scalar/lr"]] == list(range(TRAIN_STEPS))
    # (biases, saved as reductions only, get histograms of the values the hook saw, as smdebug 1.0)
    expected = {f"{c}/{n}" for c in ("gradients", "biases") for n in trial.tensor_names(collection=c)}
    assert expected == set(read["histograms"])


def test_cli_reads_a_run_on_s3(cli, s3_run, png, tmp_path):
    listing = cli("ls", s3_run, "--json")
    assert listing.returncode == 0, listing.stderr
    info = json.loads(listing.stdout)
    assert info["training_ended"] and LOSS in {t["name"] for t in info["tensors"]}

    show = cli("show", s3_run, LOSS, "--step", "2")
    assert show.returncode == 0, show.stderr
    assert f"{LOSS} at step 2 (TRAIN step 2" in show.stdout

    plot = cli("plot", s3_run, LOSS, "-o", tmp_path / "loss.png")
    assert plot.returncode == 0, plot.stderr
    png(tmp_path / "loss.png")


def test_cli_exports_from_s3_to_s3(cli, bucket, s3_run, tb, tmp_path):
    result = cli("export-tensorboard", s3_run, "s3://analysis-bucket/exported")
    assert result.returncode == 0, result.stderr
    _download(bucket, "analysis-bucket/exported/EVAL", tmp_path / "EVAL")
    read = tb(tmp_path / "EVAL")
    assert [s for s, _ in read["scalars"][LOSS]] == [TRAIN_STEPS]


def test_cli_missing_s3_run_is_one_line(cli, bucket):
    result = cli("ls", "s3://analysis-bucket/no-such-run")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "no such file or directory" in result.stderr


def test_report_and_diff_of_runs_on_s3_and_a_report_written_to_s3(cli, bucket, s3_run, tmp_path):
    """smdebug report and diff read runs on S3 (moto), and -o may be an S3 URI too, as export-tensorboard's
    LOGDIR may."""
    page = tmp_path / "s3.html"
    result = cli("report", s3_run, "-o", page)
    assert result.returncode == 0, result.stderr
    assert LOSS in page.read_text() and s3_run in page.read_text()
    plugins.reset()
    train("s3://analysis-bucket/run_again")
    plugins.reset()
    result = cli("diff", s3_run, "s3://analysis-bucket/run_again", "--regex", "Net_|Loss")
    assert result.returncode == 0 and "agree" in result.stdout, result.stdout + result.stderr
    result = cli("report", s3_run, "-o", "s3://analysis-bucket/pages/report.html", "--no-rules")
    assert result.returncode == 0, result.stderr
    assert "s3://analysis-bucket/pages/report.html" in result.stdout
    html = bucket.cat_file("analysis-bucket/pages/report.html").decode()
    assert html.startswith("<!DOCTYPE html>") and LOSS in html


def test_a_watched_s3_run_is_watched_on_through_an_outage(tmp_path, monkeypatch):
    """smdebug report --watch of a run on S3 whose endpoint stops answering: the watch goes on (it crashed
    with botocore's traceback and left a page reloading itself for good), says once that it cannot read
    the run, and Ctrl-C then leaves the page as last read, no longer reloading (without reading the run)."""
    import signal
    import subprocess
    import sys

    import s3fs
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    running = True
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    page, errors = tmp_path / "live.html", tmp_path / "stderr.txt"
    watcher = None
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        fs = s3fs.S3FileSystem()
        fs.mkdir("outage-bucket")
        plugins.reset()
        train("s3://outage-bucket/run")
        plugins.reset()
        fs.rm("outage-bucket/run/training_job_end.ts")  # a run still being written
        exe = os.path.join(os.path.dirname(sys.executable), "smdebug")
        command = ["report", "s3://outage-bucket/run", "-o", str(page), "--watch", "--interval", "0.5"]
        with open(errors, "w") as stderr:
            watcher = subprocess.Popen(
                [exe if os.path.exists(exe) else "smdebug", *command, "--no-rules"],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                # Ctrl-C must reach it even when pytest runs as a background job (SIGINT ignored, inherited)
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        deadline = time.monotonic() + 120
        while not (page.exists() and '"reload_seconds":0.5' in page.read_text()):
            assert watcher.poll() is None and time.monotonic() < deadline, errors.read_text()
            time.sleep(0.2)
        server.stop()
        running = False
        deadline = time.monotonic() + 120
        while "cannot read the run" not in errors.read_text():
            assert watcher.poll() is None and time.monotonic() < deadline, errors.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # several more attempts while the endpoint is down
        assert watcher.poll() is None, errors.read_text()[-3000:]
        watcher.send_signal(signal.SIGINT)
        stdout, _ = watcher.communicate(timeout=120)
        assert watcher.returncode == 130, errors.read_text()[-3000:]
        assert "Traceback" not in errors.read_text()
        assert errors.read_text().count("cannot read the run") == 1  # said once per outage
        html = page.read_text()
        assert '"reload_seconds":0' in html and '"reload_seconds":0.5' not in html and LOSS in html
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
        if running:
            server.stop()
        s3fs.S3FileSystem.clear_instance_cache()
