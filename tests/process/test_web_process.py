"""walqueue-web as a process, without a browser: TLS with a password file, and a refused start.

The certificate is made for the test by Debian's openssl (skipped without it; a self-signed
certificate, trusted by this test alone).
"""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from .daemon import child_env
from .web_server import WebServer

pytest.importorskip("starlette")


def certificate(workdir):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    path = workdir / "web.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(path), "-out", str(path)], check=True, capture_output=True, timeout=60)
    return path


def get(url, context, authorization=None):
    request = urllib.request.Request(url, headers={"Authorization": authorization} if authorization else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_over_tls_every_request_needs_a_password_of_the_file(daemon, workdir):
    pem = certificate(workdir)
    passwords = workdir / "passwords"
    passwords.write_text("ann:s3cret\n")
    passwords.chmod(0o600)
    server = WebServer(workdir, daemon.socket_path, "--certificate", str(pem),
                       "--password-file", str(passwords)).start()
    try:
        assert server.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(pem))
        assert get(server.url + "/", context)[0] == 401
        wrong = "Basic " + base64.b64encode(b"ann:guess").decode()
        assert get(server.url + "/", context, wrong)[0] == 401
        right = "Basic " + base64.b64encode(b"ann:s3cret").decode()
        status, page = get(server.url + "/", context, right)
        assert status == 200 and "read-only · ann" in page
    finally:
        server.stop()


def test_a_remote_listen_without_tls_and_passwords_is_refused_before_anything_is_served(daemon):
    result = subprocess.run([sys.executable, "-m", "walqueue.web.cli", daemon.socket_path,
                             "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60,
                            env=child_env())
    assert result.returncode == 2
    assert "--certificate and --password-file" in result.stderr
