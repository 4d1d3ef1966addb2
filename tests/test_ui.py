"""The MLflow UI as show_ui serves it on Colab: a real `mlflow ui` started by dsnb's own code path (start_ui), reached
the way Colab's proxy reaches it (its Host header, over HTTPS, from a page of another origin that frames it), and read
in a real headless browser (Debian's chromium and chromedriver, driven by selenium: setup.sh installs both)."""
import asyncio
import os
import signal
import ssl
import subprocess
import threading
import urllib.request

import mlflow
import psutil
import pytest

from conftest import fake_colab, free_port
from dsnb.tracking import start_ui, ui_log

PROXY_HOST = "5000-gpu-t4-s-2u4js8n7fvax5-a.us-west4-1.prod.colab.dev"  # the shape of Colab's proxy host for a port


def store_with_a_run(folder) -> tuple[str, str, str]:
    """(store URI, experiment id, run id): a real SQLite store holding one finished run with metrics."""
    uri = f"sqlite:///{folder}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("DeepSpeed_Comparison")
    run = client.create_run(experiment, run_name="With_DeepSpeed")
    client.log_metric(run.info.run_id, "samples_per_second", 1.911)
    client.log_metric(run.info.run_id, "gpu_memory_used_mb", 3750.0)
    client.set_terminated(run.info.run_id, "FINISHED")
    return uri, experiment, run.info.run_id


@pytest.fixture
def ui(tmp_path):
    uri, experiment, run_id = store_with_a_run(tmp_path)
    port = free_port()
    server, answered = start_ui(uri, port, wait_s=300)  # a loaded 2-core machine takes a minute or more to start it
    assert answered and fetch(port, "/health")[0] == 200, "mlflow ui did not start"
    yield port, experiment, run_id, server
    os.killpg(server.pid, signal.SIGKILL)  # its session: `mlflow ui` starts uvicorn and job runners of its own
    server.wait()


def fetch(port: int, path: str, data: bytes | None = None, **headers):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.mark.integration
def test_the_ui_answers_colabs_proxy_and_may_be_framed(ui):
    """Through Colab's proxy the server sees the proxy's Host header, and the page's POSTs (the run search) carry the
    proxy's origin: both answered, with no X-Frame-Options (Colab frames it from another origin); still on 127.0.0.1."""
    port, experiment, _, server = ui
    status, headers, _ = fetch(port, "/", Host=PROXY_HOST)
    assert status == 200 and "x-frame-options" not in {k.lower() for k in headers}, (status, headers)
    body = f'{{"experiment_ids": ["{experiment}"]}}'.encode()
    status, _, answer = fetch(port, "/ajax-api/2.0/mlflow/runs/search", body, Host=PROXY_HOST,
                              Origin=f"https://{PROXY_HOST}", **{"Content-Type": "application/json"})
    assert status == 200 and b"With_DeepSpeed" in answer, (status, answer[:300])
    status, _, _ = fetch(port, "/", Host="attacker.example")  # another host is still refused (DNS rebinding)
    assert status == 403
    listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port}
    assert listening == {"127.0.0.1"}, listening
    # one worker and no job runner: MLflow's defaults started 15 processes holding 3 GB (RSS) for one reader
    started = [" ".join(p.cmdline()) for p in psutil.Process(server.pid).children(recursive=True)]
    assert len(started) <= 2 and not [c for c in started if "huey" in c or "_job_runner" in c], started


def browser_or_skip():
    """Debian's chromium and chromedriver, and selenium; a skip that says why where one is missing."""
    missing = [path for path in ("/usr/bin/chromium", "/usr/bin/chromedriver") if not os.path.exists(path)]
    if missing:
        pytest.skip(f"no headless browser here ({', '.join(missing)} missing: apt-get install chromium "
                    "chromium-driver, as setup.sh does)")
    return pytest.importorskip("selenium", reason="selenium is in requirements-dev.txt")


def https_relay(target_port: int, tmp_path) -> int:
    """What Colab's proxy does for the browser: HTTPS in front, every byte passed on to the kernel's port, the Host
    header untouched. A self-signed certificate (the browser is told to accept it). Its port."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=prod.colab.dev"], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    port, loop = free_port(), asyncio.new_event_loop()

    async def pipe(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def relay(reader, writer):
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True)

    loop.run_until_complete(asyncio.start_server(relay, "127.0.0.1", port, ssl=context))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return port


@pytest.mark.integration
def test_the_ui_shows_the_runs_and_their_metrics_in_a_frame_as_on_colab(ui, tmp_path):
    """A page of another origin (the notebook) frames the UI at Colab's proxy host over HTTPS; the browser shows the
    run and its metrics inside the frame."""
    selenium = browser_or_skip()
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    port, experiment, run_id, _ = ui
    relay = https_relay(port, tmp_path)
    page = tmp_path / "notebook.html"  # file:// is another origin than the proxy's, as colab.research.google.com is
    page.write_text(f'<iframe src="https://{PROXY_HOST}/#/experiments/{experiment}/runs/{run_id}" width="1200" '
                    'height="800"></iframe>')
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--ignore-certificate-errors",
                 f"--host-resolver-rules=MAP *.prod.colab.dev 127.0.0.1:{relay}"):
        options.add_argument(flag)
    driver = selenium.webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))
    try:
        driver.get(page.as_uri())
        driver.switch_to.frame(driver.find_element(By.TAG_NAME, "iframe"))
        shown = lambda d: "With_DeepSpeed" in d.page_source and "samples_per_second" in d.page_source  # noqa: E731
        try:
            WebDriverWait(driver, 90).until(shown)
        except Exception:
            driver.save_screenshot(str(tmp_path / "frame.png"))
            with open(ui_log(port)) as log:
                errors = [line for line in log if "Error" in line or " 500 " in line]
            raise AssertionError(f"the frame shows no run (screenshot {tmp_path / 'frame.png'}): "
                                 f"{driver.find_element(By.TAG_NAME, 'body').text[:2000]!r}\nthe server's errors "
                                 f"(its log): {errors[-20:]}") from None
        text = driver.find_element(By.TAG_NAME, "body").text
        assert "1.911" in text and "3750" in text, text[:3000]
    finally:
        driver.quit()


def test_a_port_taken_by_another_ui_is_passed_over():
    """show_ui frames the port it starts its server on: one another UI (notebook 01's, say) already holds would show
    that UI's store instead."""
    import socket

    from dsnb.tracking import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert free_port(port) > port


def colab_output(monkeypatch) -> list:
    """A stand-in for google.colab.output: the ports show_ui asks it to frame."""
    import types

    framed = []
    fake_colab(monkeypatch, output=types.SimpleNamespace(
        serve_kernel_port_as_iframe=lambda port, height: framed.append(port) or port))
    return framed


def test_on_colab_a_ui_that_does_not_start_is_said_with_why_and_no_blank_frame(tmp_path, monkeypatch, capsys):
    """A server that exits (here a stand-in command for `mlflow ui` that fails as a broken install would) is not framed:
    the cell says why, from the server's own output, and the command that opens the UI."""
    import sys

    from dsnb import tracking

    uri, _, _ = store_with_a_run(tmp_path)
    framed = colab_output(monkeypatch)
    monkeypatch.setattr(tracking, "ui_server_command", lambda uri, port: [
        sys.executable, "-c", "import sys; print('ModuleNotFoundError: no module named uvicorn'); sys.exit(3)"])
    assert tracking.show_ui(uri, port=free_port()) is None and framed == []
    out = capsys.readouterr().out
    assert "The MLflow UI did not start (it exited with code 3: ModuleNotFoundError: no module named uvicorn)" in out
    assert "mlflow ui --backend-store-uri" in out


@pytest.mark.integration
def test_on_colab_show_ui_frames_the_port_its_server_answers_on(tmp_path, monkeypatch):
    from dsnb.tracking import show_ui

    uri, _, _ = store_with_a_run(tmp_path)
    framed = colab_output(monkeypatch)
    port = show_ui(uri, port=free_port())
    try:
        assert framed == [port] and fetch(port, "/health")[0] == 200
    finally:
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                os.killpg(os.getpgid(conn.pid), signal.SIGKILL)
